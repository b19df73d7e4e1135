"""`drift api` with LoRA adapters the swarm serves: `/v1/models` lists `model:adapter`, a
request naming one gets the adapted model's greedy answer (equal to local peft's), the base
id the base model's, batched together or not; an adapter nobody serves is a 404."""

from __future__ import annotations

import asyncio

import openai
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from drift.api.app import ApiConfig, build_api_app
from drift.api.service import ServiceConfig
from drift.api.swarm import swarm_engine
from tests.api.apps import API_KEY, MESSAGES, MODEL_ID, chat_ids, reference

pytestmark = pytest.mark.timeout(180)


async def test_api_serves_adapters_by_model_id(model_dir, local_model, tmp_path, swarms,
                                               sdk_models, web_apps) -> None:  # fmt: skip
    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                        init_lora_weights=False)  # fmt: skip
    peft_model = get_peft_model(base, config).eval()
    peft_model.save_pretrained(tmp_path / "pirate")
    prompt = chat_ids(local_model)
    want_base = reference(local_model, prompt, 12)[0]
    want_lora = reference((peft_model, local_model[1]), prompt, 12)[0]
    assert want_lora != want_base  # the adapter changes the answer

    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)],
                               adapters=(("pirate", str(tmp_path / "pirate")),))  # fmt: skip
    model = await sdk_models.open(model_dir, swarm.token)
    engine = swarm_engine(model, local_model[1], model_id=MODEL_ID)
    service = ServiceConfig(max_concurrent=2, max_batch=2)
    url = await web_apps.start(build_api_app(engine, ApiConfig(api_keys=(API_KEY,),
                                                                service=service)))  # fmt: skip
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    async with client:
        ids = [m.id for m in (await client.models.list()).data]
        assert ids == [MODEL_ID, f"{MODEL_ID}:pirate"]
        assert (await client.models.retrieve(f"{MODEL_ID}:pirate")).id == f"{MODEL_ID}:pirate"
        lora, plain = await asyncio.gather(*(
            client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=12,
                                           temperature=0)
            for name in (f"{MODEL_ID}:pirate", MODEL_ID)
        ))  # fmt: skip
        assert lora.choices[0].message.content == want_lora
        assert plain.choices[0].message.content == want_base
        with pytest.raises(openai.NotFoundError, match="pirate"):
            await client.chat.completions.create(model=f"{MODEL_ID}:parrot", messages=MESSAGES,
                                                 max_tokens=4)  # fmt: skip
