"""scripts/bench_serving.py: its pure parts (load specs, seeded schedules and lengths,
percentiles, the summary) checked exactly, and one short run against a real `drift api` over
a loopback swarm whose counts must match the answers (each one equal to local transformers)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_serving  # noqa: E402
from serving_stats import (  # noqa: E402
    Load,
    Outcome,
    arrival_offsets,
    lengths,
    parse_load,
    percentile,
    prompt_text,
    solo_bound,
    summarize,
)

from drift.api.app import ApiConfig, build_api_app  # noqa: E402
from drift.api.service import ServiceConfig  # noqa: E402
from drift.api.swarm import swarm_engine  # noqa: E402
from tests.api.apps import API_KEY, MODEL_ID, reference  # noqa: E402


def test_parse_load() -> None:
    assert parse_load("concurrency:8") == Load("concurrency", 8.0)
    assert parse_load("rate:inf").value == math.inf
    assert parse_load("interval:0.5").label == "interval:0.5"
    for bad, word in (("burst:3", "KIND"), ("rate:", "KIND"), ("rate:x", "not a number"),
                      ("rate:0", "> 0"), ("concurrency:1.5", "whole"),
                      ("concurrency:0", "whole"), ("interval:-1", ">= 0")):  # fmt: skip
        with pytest.raises(ValueError, match=word):
            parse_load(bad)


def test_arrival_offsets() -> None:
    assert arrival_offsets(Load("concurrency", 4), 5, 0) is None
    assert arrival_offsets(Load("interval", 0.5), 4, 0) == [0.0, 0.5, 1.0, 1.5]
    assert arrival_offsets(Load("rate", math.inf), 3, 0) == [0.0, 0.0, 0.0]
    poisson = arrival_offsets(Load("rate", 4.0), 2000, 7)
    assert poisson == arrival_offsets(Load("rate", 4.0), 2000, 7)  # seeded
    assert poisson != arrival_offsets(Load("rate", 4.0), 2000, 8)
    assert poisson[0] == 0.0 and poisson == sorted(poisson)
    gaps = [b - a for a, b in zip(poisson, poisson[1:], strict=False)]
    assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.1)  # mean gap 1/rate


def test_lengths_and_prompts() -> None:
    assert lengths(4, 32, 0.0, 0) == [32, 32, 32, 32]
    drawn = lengths(500, 20, 0.5, 3)
    assert drawn == lengths(500, 20, 0.5, 3)
    assert min(drawn) >= 10 and max(drawn) <= 30 and len(set(drawn)) > 10
    assert lengths(3, 1, 1.0, 0) == [max(1, x) for x in lengths(3, 1, 1.0, 0)]  # never 0
    with pytest.raises(ValueError):
        lengths(2, 8, 1.5, 0)
    assert prompt_text(2, 5, 0) == prompt_text(2, 5, 0) != prompt_text(3, 5, 0)
    assert len(prompt_text(2, 5, 0).split()) == 3 + 5  # "Continue this text:" and 5 words


def test_percentile() -> None:
    assert math.isnan(percentile([], 50))
    assert percentile([7.0], 99) == 7.0
    values = [float(v) for v in range(1, 101)]  # 1..100, shuffled order must not matter
    assert percentile(values[::-1], 50) == pytest.approx(50.5)
    assert percentile(values, 90) == pytest.approx(90.1)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 100.0


def test_summarize() -> None:
    ok1 = Outcome(0, sent=0.0, first=0.5, done=2.5, text="a", tokens=5)  # tpot 0.5
    ok2 = Outcome(1, sent=1.0, first=1.2, done=1.2, text="b", tokens=1)  # no tpot
    bad = Outcome(2, sent=1.5, error="HTTP 429: busy")
    s = summarize([ok1, ok2, bad], wall_s=4.0)
    assert (s["requests"], s["completed"], s["errors"]) == (3, 2, 1)
    assert s["output_tokens"] == 6 and s["output_tokens_per_s"] == 1.5
    assert s["requests_per_s"] == 0.5
    assert s["ttft_ms_p50"] == pytest.approx(350.0)  # between 500 and 200
    assert s["tpot_ms_p99"] == pytest.approx(500.0)
    assert s["e2e_ms_p50"] == pytest.approx((2500 + 200) / 2)
    assert s["error_messages"] == ["HTTP 429: busy"]


def test_solo_bound() -> None:
    """Each request at its solo latency from when it was sent: the last one ends at
    max(sent + solo); a request failed in either run counts in neither."""
    solo = [
        Outcome(0, sent=0.0, done=2.0, tokens=4),
        Outcome(1, sent=2.0, done=4.0, tokens=4),
        Outcome(2, sent=4.0, done=5.0, tokens=2),
        Outcome(3, sent=5.0, error="HTTP 500"),
    ]
    spread = [
        Outcome(0, sent=0.0, done=3.0, tokens=4),
        Outcome(1, sent=0.5, done=3.5, tokens=4),
        Outcome(2, sent=1.0, error="HTTP 429"),
        Outcome(3, sent=1.5, done=4.0, tokens=9),
    ]
    assert solo_bound(spread, solo) == pytest.approx(8 / 2.5)  # ends at max(2.0, 0.5 + 2.0)
    assert solo_bound(solo, solo) == pytest.approx(10 / 5.0)
    assert math.isnan(solo_bound([Outcome(0, sent=0.0, error="x")], solo[:1]))


@pytest.mark.timeout(180)
async def test_bench_against_drift_api(model_dir, local_model, swarms, sdk_models,
                                       web_apps, capsys) -> None:  # fmt: skip
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    model = await sdk_models.open(model_dir, swarm.token)
    engine = swarm_engine(model, local_model[1], model_id=MODEL_ID)
    service = ServiceConfig(max_concurrent=4, max_batch=4)
    url = await web_apps.start(build_api_app(engine, ApiConfig((API_KEY,), service=service)))
    args = bench_serving.parser().parse_args([
        "--url", url, "--loads", "concurrency:1", "rate:inf", "interval:0.05",
        "--num_requests", "4", "--input_len", "3", "--output_len", "8",
        "--output_spread", "0.5", "--seed", "5",
    ])  # fmt: skip
    summaries = await bench_serving.bench(url, API_KEY, args)

    tokenizer = local_model[1]
    bodies = bench_serving.request_bodies(args, MODEL_ID)
    refs = []
    for body in bodies:
        text = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True,
                                             tokenize=False)  # fmt: skip
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        refs.append(reference(local_model, ids, body["max_tokens"]))
    assert len({b["max_tokens"] for b in bodies}) > 1  # the lengths really vary
    for s in summaries:
        assert (s["requests"], s["completed"], s["errors"]) == (4, 4, 0), s
        assert [a["text"] for a in s["answers"]] == [r[0] for r in refs]
        assert [a["tokens"] for a in s["answers"]] == [r[1] for r in refs]
        assert s["output_tokens"] == sum(r[1] for r in refs)
        assert s["output_tokens_per_s"] == pytest.approx(s["output_tokens"] / s["wall_s"])
        assert s["bound_tokens_per_s"] > 0
    assert [s["same_as_first"] for s in summaries] == ["-", "4/4", "4/4"]
    table = capsys.readouterr().out
    assert "concurrency:1" in table and "rate:inf" in table and "interval:0.05" in table

    # every request failing is counted as sent and failed, with the server's reason
    args = bench_serving.parser().parse_args([
        "--url", url, "--model", "no-such-model", "--num_requests", "3", "--warmup", "0",
        "--loads", "concurrency:2",
    ])  # fmt: skip
    (failed,) = await bench_serving.bench(url, API_KEY, args)
    assert (failed["requests"], failed["completed"], failed["errors"]) == (3, 0, 3)
    assert failed["output_tokens"] == 0
    assert len(failed["error_messages"]) == 1 and "HTTP 404" in failed["error_messages"][0]
