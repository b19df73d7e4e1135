"""Pure pieces of the API: stop-string holdback, penalties, seeded sampling, request parsing."""

from __future__ import annotations

import pytest
import torch

from drift.api.engine import CausalLMEngine
from drift.api.protocol import parse_chat, parse_completion
from drift.api.sampling import PenaltyProcessor, SeededSampler
from drift.api.textstream import StopTextStream
from drift.wire.errors import BadRequest
from tests.api.apps import char_tokenizer, tiny_chat_model


def _pieces(pieces: list[str]):
    """A fake tokenizer: token i decodes to pieces[i]; a '?' piece is half a UTF-8 char."""

    def decode(ids: list[int]) -> str:
        text = "".join(pieces[i] for i in ids)
        return text.replace("?", "\ufffd") if text.endswith("?") else text.replace("?", "")

    return decode


def _run(pieces: list[str], stops: list[str]) -> tuple[list[str], str, bool]:
    stream = StopTextStream(_pieces(pieces), stops)
    out = [stream.push(i) for i in range(len(pieces))]
    out.append(stream.finish())
    return out, "".join(out), stream.stopped


def test_stop_string_split_over_tokens_is_held_back_then_dropped() -> None:
    out, text, stopped = _run(["Hello", " wor", "ld", "END", "x"], ["worldEND"])
    assert text == "Hello " and stopped
    assert out[:2] == ["Hello", " "]  # " wor" may start the stop string: held back


def test_false_alarm_is_released() -> None:
    out, text, stopped = _run(["ab", "c", "x", "y"], ["cd"])
    assert out == ["ab", "", "cx", "y", ""] and text == "abcxy" and not stopped


def test_unfinished_utf8_is_held() -> None:
    out, text, _ = _run(["a", "?", "é"], [])
    assert out == ["a", "", "é", ""]


def test_earliest_of_several_stops_wins() -> None:
    _, text, stopped = _run(["one two three"], ["three", "two"])
    assert text == "one " and stopped


def test_penalties() -> None:
    scores = torch.zeros(1, 5)
    ids = torch.tensor([[4, 4, 1, 1, 1, 2]])  # prompt [4, 4], generated [1, 1, 1, 2]
    out = PenaltyProcessor(2, presence=0.5, frequency=0.25)(ids, scores)
    assert out.tolist() == [[0.0, -1.25, -0.75, 0.0, 0.0]]


def test_seeded_sampler_is_reproducible_and_respects_top_p() -> None:
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    draw = [
        int(SeededSampler(1.0, 0.7, g)(None, scores).argmax())
        for g in [torch.Generator().manual_seed(0)]
        for _ in range(200)
    ]
    assert set(draw) == {0, 1}  # top-p 0.7 keeps the two most likely tokens only
    again = [
        int(SeededSampler(1.0, 0.7, g)(None, scores).argmax())
        for g in [torch.Generator().manual_seed(0)]
        for _ in range(200)
    ]
    assert draw == again


def test_parse_refuses_unknown_and_bad_types() -> None:
    req = parse_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "stop": "x",
            "user": "u",
        }  # fmt: skip
    )
    assert req.messages[0].content == "hi" and req.options.max_tokens == 7
    assert req.options.stop == ("x",)
    for bad, param in [
        ({"model": "m", "messages": [{"role": "user"}], "top_p": 2}, "top_p"),
        ({"model": 3, "messages": [{"role": "user"}]}, "model"),
        ({"model": "m", "messages": [{"role": "user"}], "seed": 1.5}, "seed"),
        ({"model": "m", "messages": [{"role": "user"}], "stream": "yes"}, "stream"),
        ({"model": "m", "messages": [{"role": "user"}], "whatever": [1]}, "whatever"),
        ({"model": "m", "messages": [{"role": "robot"}]}, "messages[0].role"),
        (
            {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
        ),
        ({"model": "m", "messages": [{"role": "user"}], "logit_bias": {"1": 5}}, "logit_bias"),
    ]:
        with pytest.raises(BadRequest) as info:
            parse_chat(bad)
        assert info.value.details["param"] == param
    assert parse_completion({"model": "m", "prompt": [[1, 2], [3]]}).prompts == ((1, 2), (3,))
    with pytest.raises(BadRequest):
        parse_completion({"model": "m", "prompt": [1, "a"]})


def test_chat_without_template_is_a_clear_400() -> None:
    engine = CausalLMEngine(tiny_chat_model(), char_tokenizer(chat_template=None), model_id="m")
    with pytest.raises(BadRequest, match="no chat template"):
        engine.chat_prompt(parse_chat({"model": "m", "messages": [{"role": "user"}]}).messages)


def test_sliding_tells_which_models_attend_through_a_window() -> None:
    """A group is forked only without sliding windows where its prompts differ in length
    (drift.api.swarm): padding after the prefix would shift a window by cache slots."""
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config

    from drift.api.swarm import sliding

    assert not sliding(LlamaConfig(num_hidden_layers=2))
    assert not sliding(MistralConfig(num_hidden_layers=2, sliding_window=None))
    assert sliding(MistralConfig(num_hidden_layers=2, sliding_window=8))
    assert sliding(Gemma3TextConfig(num_hidden_layers=2))
    assert not sliding(Qwen2Config(num_hidden_layers=2))
    assert sliding(Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=8,
                               max_window_layers=0))  # fmt: skip
