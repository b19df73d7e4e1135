"""The issue's "done when", on the real SmolLM2-135M over a loopback swarm (0:15 / 15:30)
behind the real `drift api` app, driven by the official `openai` client and langchain-openai:
a required get_weather(city) call validates and its result yields a final answer, a
json_schema answer validates for 20 prompts, embeddings are stable and equal local
transformers, and docs/api.md's tool-calling and LangChain examples run as written.
One swarm and one app for the module (on a loop in a background thread; clients are sync).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from drift.api.app import ApiConfig, build_api_app
from drift.api.service import ServiceConfig
from drift.api.swarm import swarm_engine
from drift.client import AutoDistributedModelForCausalLM
from tests.api.apps import start_app
from tests.client.swarms import start_swarm, stop_swarm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

KEY = "sk-drift"
API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"], "additionalProperties": False},
    },
}  # fmt: skip
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "age": {"type": "integer", "minimum": 0, "maximum": 130},
                         "city": {"type": "string", "maxLength": 40}}}  # fmt: skip
PEOPLE = ["Marie Curie", "Albert Einstein", "Ada Lovelace", "Alan Turing", "Frida Kahlo",
          "Nelson Mandela", "Leonardo da Vinci", "Jane Austen", "Isaac Newton", "Cleopatra",
          "Mahatma Gandhi", "Serena Williams", "Pablo Picasso", "Rosa Parks", "Charles Darwin",
          "Amelia Earhart", "Wolfgang Mozart", "Nikola Tesla", "Harriet Tubman", "Galileo Galilei"]  # fmt: skip


class Served:
    """The swarm, the SDK model and the API app, on an event loop in a background thread."""

    def __init__(self, model_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.model_dir = model_dir
        self.swarm = self.model = self.runner = None
        self.url = ""

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=600)

    async def start(self) -> None:
        self.swarm = await start_swarm(self.model_dir, [(0, 15), (15, 30)])
        self.model = await asyncio.to_thread(AutoDistributedModelForCausalLM.from_pretrained,
                                             self.model_dir, initial_peers=self.swarm.token)  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        engine = swarm_engine(self.model, tokenizer, model_id="smollm2")
        service = ServiceConfig(max_concurrent=8, max_batch=8, default_max_tokens=128)
        app = build_api_app(engine, ApiConfig((KEY,), service=service))
        self.runner, self.url = await start_app(app)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.model is not None:
            await asyncio.to_thread(self.model.close)
        if self.swarm is not None:
            await stop_swarm(self.swarm)


@pytest.fixture(scope="module")
def smollm2_dir(smollm2_cache: Path) -> Path:
    from drift.models.checkpoint import open_checkpoint

    return Path(open_checkpoint("smollm2", cache_dir=smollm2_cache).path)


@pytest.fixture(scope="module")
def served(smollm2_dir: Path) -> Iterator[Served]:
    served = Served(smollm2_dir)
    try:
        served.run(served.start())
        yield served
    finally:
        served.run(served.stop())
        served.loop.call_soon_threadsafe(served.loop.stop)
        served.thread.join(timeout=10)


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY, max_retries=0, timeout=300) as c:
        yield c


def test_required_tool_call_then_final_answer(client: openai.OpenAI) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    # SmolLM2-135M repeats a call when it may make several (parallel_tool_calls, the default)
    first = client.chat.completions.create(model="smollm2", messages=messages, tools=[WEATHER],
                                           tool_choice="required", temperature=0,
                                           parallel_tool_calls=False)  # fmt: skip
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) >= 1
    call = choice.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": json.dumps({"city": args["city"], "temperature_c": 18, "sky": "sunny"})})  # fmt: skip
    final = client.chat.completions.create(model="smollm2", messages=messages, tools=[WEATHER],
                                           temperature=0, max_tokens=64)  # fmt: skip
    answer = final.choices[0]
    assert answer.message.tool_calls is None, answer.message.tool_calls
    assert answer.finish_reason in ("stop", "length") and answer.message.content.strip()


def test_json_schema_validates_for_20_prompts(client: openai.OpenAI) -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }

    def ask(name: str) -> str:
        reply = client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=96, response_format=fmt,
            messages=[{"role": "user", "content": f"Describe {name} as JSON with name, age and city."}],
        )  # fmt: skip
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        return reply.choices[0].message.content

    with ThreadPoolExecutor(8) as pool:  # concurrent: the API batches them
        answers = list(pool.map(ask, PEOPLE))
    assert len(set(answers)) > 10, "20 prompts should give (mostly) different answers"
    for text in answers:
        jsonschema.validate(json.loads(text), PERSON)


def test_embeddings_stable_distinct_and_equal_local(client: openai.OpenAI, smollm2_dir) -> None:
    texts = ["The cat sat on the mat.", "Quarterly revenue grew by eight percent."]
    first = [d.embedding for d in client.embeddings.create(model="smollm2", input=texts).data]
    again = client.embeddings.create(model="smollm2", input=texts[0]).data[0].embedding
    assert again == first[0] and first[0] != first[1]
    local = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    for text, got in zip(texts, first, strict=True):
        with torch.no_grad():
            final = local.model(torch.tensor([tokenizer(text)["input_ids"]])).last_hidden_state[0]
        ref = torch.nn.functional.normalize(final.mean(0), dim=-1)
        torch.testing.assert_close(torch.tensor(got), ref, rtol=0, atol=1e-4)


def test_langchain_tools_and_structured_output(served: Served) -> None:
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    llm = ChatOpenAI(model="smollm2", base_url=f"{served.url}/v1", api_key=KEY, temperature=0,
                     max_retries=0, timeout=300)  # fmt: skip

    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return f"18 C and sunny in {city}"

    bound = llm.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False)
    message = bound.invoke("Weather in Rome?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    assert isinstance(message.tool_calls[0]["args"]["city"], str)

    class Capital(BaseModel):
        country: str = Field(max_length=40)
        capital: str = Field(max_length=40)

    result = llm.with_structured_output(Capital).invoke("What is the capital of France?")
    assert isinstance(result, Capital) and result.capital


def readme_block(title: str) -> str:
    section = API_DOC.read_text().split("## OpenAI-compatible API", 1)[1].split("\n## ", 1)[0]
    match = re.search(rf"<!-- test: {title} -->\n```python\n(.*?)```", section, re.S)
    assert match, f"docs/api.md's OpenAI-compatible API section has no '{title}' example"
    return match.group(1)


@pytest.mark.parametrize("title", ["tool calling", "langchain"])
def test_readme_examples(served: Served, title: str, capsys) -> None:
    code = readme_block(title).replace("http://127.0.0.1:8000", served.url)
    exec(compile(code, f"docs/api.md ({title})", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.strip(), "the example prints its result"
    if title == "tool calling":
        assert "get_weather" in printed
