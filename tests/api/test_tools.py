"""Tool calling and structured output through the real `drift api` app (tiny random model,
the official `openai` client): calls parse and validate against their schemas, streamed
deltas rebuild the same calls, history with tool calls and results renders (generic format
and a template with native tools), and the grammar never changes what it allows anyway."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import jsonschema
import openai
import pytest

from drift.api.app import ApiConfig, build_api_app
from drift.api.engine import CausalLMEngine
from drift.api.messages import parse_messages, parse_tools
from drift.api.service import ServiceConfig
from drift.api.tools import CallDelta, ToolCallParser, call_text
from tests.api.apps import API_KEY, MODEL_ID, char_tokenizer, start_app, tiny_chat_model

pytestmark = pytest.mark.timeout(180)

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"], "additionalProperties": False}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                      "parameters": CITY}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"], "additionalProperties": False}}},
]  # fmt: skip
ASK = [{"role": "user", "content": "Weather in Paris?"}]
HERMES = (  # a template that renders tools itself, as Qwen's does (shortened)
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t | tojson }}{% endfor %}"
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    '{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n{"name": "{{ c.function.name }}", '
    '"arguments": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}'
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _schema(name: str) -> dict:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


@pytest.fixture
async def client(local_model, request) -> AsyncIterator[openai.AsyncOpenAI]:
    model, tokenizer = local_model
    # one character per token: the tools' prompt needs more than the config's 1024 (rotary)
    engine = CausalLMEngine(model, tokenizer, model_id=MODEL_ID, context_length=2048)
    batch = getattr(request, "param", 1)
    service = ServiceConfig(max_concurrent=4, queue_size=8, max_batch=batch, batch_wait_s=0.2)
    runner, url = await start_app(build_api_app(engine, ApiConfig((API_KEY,), service=service)))
    try:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0,
                                      timeout=120) as c:  # fmt: skip
            yield c
    finally:
        await runner.cleanup()


async def _streamed(client, **kwargs) -> tuple[str, list[dict], str | None]:
    """(content, tool calls rebuilt from the deltas, finish_reason) of a streamed chat."""
    stream = await client.chat.completions.create(stream=True, **kwargs)
    content, calls, finish = "", [], None
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                if d.index == len(calls):
                    assert d.id and d.function.name, "a call's first delta names it"
                    calls.append({"id": d.id, "name": d.function.name, "arguments": ""})
                calls[d.index]["arguments"] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, calls, finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
async def test_forced_calls_validate_and_stream_the_same(client, choice) -> None:
    kwargs = dict(model=MODEL_ID, messages=ASK, tools=TOOLS, tool_choice=choice,
                  max_tokens=150, temperature=0, parallel_tool_calls=False)  # fmt: skip
    resp = await client.chat.completions.create(**kwargs)
    message = resp.choices[0].message
    assert resp.choices[0].finish_reason == "tool_calls" and message.tool_calls
    for call in message.tool_calls:
        if isinstance(choice, dict):
            assert call.function.name == "add"
        jsonschema.validate(json.loads(call.function.arguments), _schema(call.function.name))
    content, calls, finish = await _streamed(client, **kwargs)
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls
    ]


async def test_single_call_without_parallel_and_sampled_calls_valid(client) -> None:
    for seed in range(4):
        resp = await client.chat.completions.create(
            model=MODEL_ID, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=150,
            temperature=1.0, seed=seed, parallel_tool_calls=False)  # fmt: skip
        calls = resp.choices[0].message.tool_calls
        assert len(calls) == 1 and resp.choices[0].finish_reason == "tool_calls"
        jsonschema.validate(
            json.loads(calls[0].function.arguments), _schema(calls[0].function.name)
        )


async def test_auto_and_none(client) -> None:
    kwargs = dict(model=MODEL_ID, messages=ASK, tools=TOOLS, max_tokens=200, temperature=0)
    auto = await client.chat.completions.create(**kwargs)
    msg = auto.choices[0].message
    content, calls, _ = await _streamed(client, **kwargs)
    if msg.tool_calls:  # whichever the model picked, it is well formed and streamed alike
        assert [c["arguments"] for c in calls] == [c.function.arguments for c in msg.tool_calls]
    else:
        assert msg.content == content and not content.startswith("<tool_call>")
    none = await client.chat.completions.create(tool_choice="none", **kwargs)
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].finish_reason in ("stop", "length")


async def test_history_with_calls_and_results(client) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]  # fmt: skip
    resp = await client.chat.completions.create(
        model=MODEL_ID, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    plain = await client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=8)
    assert resp.choices[0].message.content is not None
    # the call and its result are in the prompt (tools are left out with tool_choice none)
    assert resp.usage.prompt_tokens > plain.usage.prompt_tokens + 2 * len(call_text("x", "{}"))


def test_prompt_formats() -> None:
    tools = parse_tools(TOOLS)
    call = {"id": "c1", "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}  # fmt: skip
    messages = parse_messages([*ASK, {"role": "assistant", "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": "c1", "content": "3"}])  # fmt: skip
    generic = CausalLMEngine(tiny_chat_model(), char_tokenizer(), model_id="m")
    assert not generic.template.native_tools
    text = generic.template.render(messages, tools)
    assert "<tools>\n" in text and call_text("add", '{"a": 1, "b": 2}') in text
    assert '<|im_start|>user\n<tool_response>\n{"name": "add", "content": "3"}' in text
    native = CausalLMEngine(tiny_chat_model(), char_tokenizer(HERMES), model_id="m")
    assert native.template.native_tools
    text = native.template.render(messages, tools)
    assert text.startswith("<|im_start|>system\nTOOLS:") and "<|im_start|>tool\n3" in text
    assert call_text("add", '{"a": 1, "b": 2}') in text  # the template's own rendering


def test_parser_releases_only_what_is_certain() -> None:
    text = call_text("f", '{"x": "}\\n</tool_call>", "y": [1]}') + "\n" + call_text("g", "{}")
    for step in (1, 2, 5, len(text)):
        parser = ToolCallParser(text_allowed=True)
        pieces = []
        for i in range(0, len(text), step):
            pieces += parser.push(text[i : i + step])
        pieces += parser.finish()
        calls: list[list[str]] = []
        for p in pieces:
            assert isinstance(p, CallDelta)
            if p.id is not None:
                calls.append([p.name, ""])
            calls[p.index][1] += p.arguments
        assert calls == [["f", '{"x": "}\\n</tool_call>", "y": [1]}'], ["g", "{}"]]
    parser = ToolCallParser(text_allowed=True)
    assert parser.push("<tool") == [] and parser.push("s are") == ["<tools are"]


async def test_structured_output_chat_and_completions(client) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
        "required": ["answer", "n"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    for seed in range(3):
        resp = await client.chat.completions.create(model=MODEL_ID, messages=ASK, seed=seed,
                                                    response_format=fmt, max_tokens=200)  # fmt: skip
        jsonschema.validate(json.loads(resp.choices[0].message.content), schema)
    streamed, _, _ = await _streamed(client, model=MODEL_ID, messages=ASK, seed=0,
                                     response_format=fmt, max_tokens=200)  # fmt: skip
    again = await client.chat.completions.create(model=MODEL_ID, messages=ASK, seed=0,
                                                 response_format=fmt, max_tokens=200)  # fmt: skip
    assert streamed == again.choices[0].message.content
    obj = await client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=200,
        temperature=0, response_format={"type": "json_object"})  # fmt: skip
    text = obj.choices[0].message.content  # a random model may not close its strings in time
    assert text.startswith("{")
    assert obj.choices[0].finish_reason == "length" or isinstance(json.loads(text), dict)
    comp = await client.completions.create(model=MODEL_ID, prompt="JSON:", max_tokens=200,
        temperature=0, extra_body={"response_format": fmt})  # fmt: skip
    jsonschema.validate(json.loads(comp.choices[0].text), schema)


@pytest.mark.parametrize("client", [4], indirect=True)
async def test_grammar_rows_in_one_batch(client) -> None:
    import asyncio

    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}
    plain, forced, structured = await asyncio.gather(
        client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=20, temperature=0),
        client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=TOOLS, max_tokens=150,
                                       tool_choice="required", temperature=0),
        client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=200,
                                       response_format=fmt, temperature=0),
    )  # fmt: skip
    call = forced.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), _schema(call.function.name))
    jsonschema.validate(json.loads(structured.choices[0].message.content), CITY)
    assert plain.choices[0].message.content is not None


async def test_bad_tool_requests_are_400(client) -> None:
    bad = [
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
         "tool_choice"),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(tools=[{"type": "retrieval"}]), "tools[0]"),
        (dict(response_format={"type": "json_schema", "json_schema": {"schema": {"type": 3}}}),
         "response_format"),
        (dict(functions=[{"name": "f"}]), "functions"),
    ]  # fmt: skip
    for extra, param in bad:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model=MODEL_ID, messages=ASK, **extra)
        assert info.value.param == param, (extra, info.value.message)


async def test_a_call_cut_off_by_max_tokens_comes_back_in_the_history(client) -> None:
    """An agent sends the answer back as it got it: a call cut off by max_tokens has arguments
    that are not JSON yet. OpenAI takes that history; so does drift api, both formats."""
    forced = {"type": "function", "function": {"name": "get_weather"}}
    header = len(call_text("get_weather", "")) - len("}\n</tool_call>")  # one token per char
    resp = await client.chat.completions.create(
        model=MODEL_ID, messages=ASK, tools=TOOLS, tool_choice=forced, max_tokens=header + 4,
        temperature=0)  # fmt: skip
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    cut = choice.message.tool_calls[0]
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.function.arguments)
    history = [*ASK, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": cut.id, "content": "unknown"}]  # fmt: skip
    again = await client.chat.completions.create(
        model=MODEL_ID, messages=history, tools=TOOLS, max_tokens=4, temperature=0
    )
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")
    messages = parse_messages(history)
    generic = CausalLMEngine(tiny_chat_model(), char_tokenizer(), model_id="m")
    assert call_text("get_weather", cut.function.arguments) in generic.template.render(
        messages, parse_tools(TOOLS))  # fmt: skip
    native = CausalLMEngine(tiny_chat_model(), char_tokenizer(HERMES), model_id="m")
    assert cut.function.arguments in native.template.render(messages, parse_tools(TOOLS))
