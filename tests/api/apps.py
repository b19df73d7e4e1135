"""Helpers of the API tests: a tiny random-weight llama with a character-level chat
tokenizer, an app runner on 127.0.0.1, and greedy references from plain transformers.
Fixtures built from them live in conftest.py."""

from __future__ import annotations

import asyncio
import string
import threading
from collections.abc import Callable, Sequence

import torch
from aiohttp import web
from tokenizers import Tokenizer, decoders, models
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from drift.api.engine import BatchRow, GenerationParams, TokenEvent
from tests.tiny_models import TINY_CONFIGS

MODEL_ID = "tiny-chat"
API_KEY = "sk-test-key"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
CHARS = list(string.printable[:95]) + ["\n"]  # printable ASCII (no \t\r\x0b\x0c) + newline
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer(chat_template: str | None = CHATML) -> PreTrainedTokenizerFast:
    """One token per character; decoding concatenates. Always decodes to valid text."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(CHARS)))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(SPECIALS)
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
    )
    fast.chat_template = chat_template
    return fast


def tiny_chat_model(seed: int = 0) -> AutoModelForCausalLM:
    params = dict(TINY_CONFIGS["llama"])
    params.pop("model_type")
    params.update(
        vocab_size=len(SPECIALS) + len(set(CHARS)),
        max_position_embeddings=1024,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    config = AutoConfig.for_model("llama", **params)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


class AppRunners:
    """Apps started on 127.0.0.1 by one test (the `web_apps` fixture cleans them up)."""

    def __init__(self) -> None:
        self.runners: list[web.AppRunner] = []

    async def start(self, app: web.Application) -> str:
        runner, url = await start_app(app)
        self.runners.append(runner)
        return url

    async def cleanup_all(self) -> None:
        for runner in reversed(self.runners):
            await runner.cleanup()


async def start_app(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def reference(local_model, prompt_ids: list[int], max_new_tokens: int) -> tuple[str, int, str]:
    """(text, completion tokens, finish_reason) from plain transformers greedy generate."""
    model, tokenizer = local_model
    ids = torch.tensor([prompt_ids])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=[0, 2],
        pad_token_id=0,
    )[0, len(prompt_ids) :].tolist()
    finish = "stop" if out[-1] in (0, 2) else "length"
    return tokenizer.decode(out, skip_special_tokens=True), len(out), finish


def chat_ids(local_model) -> list[int]:
    tokenizer = local_model[1]
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def greedy(max_new_tokens: int) -> GenerationParams:
    """Greedy decoding of up to `max_new_tokens` tokens, no penalties, no logprobs."""
    return GenerationParams(max_new_tokens=max_new_tokens, temperature=0.0, top_p=1.0,
                            presence_penalty=0.0, frequency_penalty=0.0, top_logprobs=None)  # fmt: skip


class Rows:
    """Engine rows (drift.api.engine.BatchRow) for a list of prompts, greedy: each row's
    tokens as they come, its cancel event, and an event set when it ends (with no error).
    `on_token(i, event)` also sees every token of row i."""

    def __init__(self, prompts: Sequence[list[int]], lengths: Sequence[int],
                 on_token: Callable[[int, TokenEvent], None] | None = None) -> None:  # fmt: skip
        self.prompts, self.lengths, self.on_token = prompts, lengths, on_token
        self.tokens: list[list[int]] = [[] for _ in prompts]
        self.ended = [threading.Event() for _ in prompts]
        self.cancel = [threading.Event() for _ in prompts]

    def row(self, i: int) -> BatchRow:
        def on_token(event: TokenEvent) -> None:
            self.tokens[i].append(event.token_id)
            if self.on_token is not None:
                self.on_token(i, event)

        def on_done(exc: BaseException | None = None) -> None:
            assert exc is None
            self.ended[i].set()

        return BatchRow(self.prompts[i], greedy(self.lengths[i]), torch.Generator(), on_token,
                        self.cancel[i], on_done)  # fmt: skip

    async def wait(self, *indices: int) -> None:
        """Until rows `indices` (default: all) have ended; a minute at most each."""
        for i in indices or range(len(self.prompts)):
            assert await asyncio.to_thread(self.ended[i].wait, 60)
