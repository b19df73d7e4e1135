"""Decode steps' torch threads (drift.server.decode_threads): measured at start-up where the
operator did not choose, applied to plain decode steps only, and shown in /blocks."""

from __future__ import annotations

import time

import aiohttp
import pytest
import torch

from drift.models.threads import choose
from drift.server.config import parse_decode_threads
from drift.server.decode_threads import BATCH_ROWS
from tests.server.harness import start_block_server
from tests.server.wsclient import RawSession


def _sleeps(seconds_on: dict[int, float]):
    """A fake decode step taking `seconds_on[n]` on n torch threads."""

    def step() -> None:
        time.sleep(seconds_on[torch.get_num_threads()])

    return step


def test_choose_keeps_a_team_only_where_it_is_clearly_faster(two_threads) -> None:
    faster = _sleeps({4: 0.002, 1: 0.006})
    chosen, medians = choose(faster, 4, rounds=3, pause_s=0.0)
    assert chosen == 4 and medians[4] < medians[1], medians
    # a team no faster than one thread (its threads packed on one core): one thread
    chosen, medians = choose(_sleeps({4: 0.004, 1: 0.004}), 4, rounds=3, pause_s=0.0)
    assert chosen == 1 and set(medians) == {4, 1}
    assert torch.get_num_threads() == 2  # restored
    assert choose(_sleeps({1: 0.001}), 1) == (1, {})  # nothing to choose


def test_parse_decode_threads() -> None:
    assert parse_decode_threads("auto", {}) is None
    assert parse_decode_threads("auto", {"OMP_NUM_THREADS": "4"}) == 0  # the operator's
    assert parse_decode_threads("3", {"OMP_NUM_THREADS": "4"}) == 3
    for bad in ("0", "-1", "many"):
        with pytest.raises(ValueError, match="--decode_threads"):
            parse_decode_threads(bad, {})


async def test_decode_steps_run_on_the_chosen_threads(tiny_llama, two_threads) -> None:
    running = await start_block_server(tiny_llama, 0, 2, decode_threads=1)
    backend = running.server.backend
    seen: list[tuple[int, int]] = []  # (tokens of the step, torch threads it ran on)
    compute = backend.compute_steps

    def recording(steps):
        seen.append((int(steps[0].hidden.shape[1]), torch.get_num_threads()))
        return compute(steps)

    backend.compute_steps = recording
    try:
        decode = running.server.describe().to_wire()["decode"]
        assert decode["threads"] == 1 and decode["threads_reason"] == "--decode_threads"
        hidden = torch.randn(1, 6, backend.hidden_size, generator=torch.Generator().manual_seed(1))
        async with aiohttp.ClientSession() as http:
            sess = await RawSession.open(http, running.url, backend.fingerprint, 0, 2,
                                         max_length=16)  # fmt: skip
            outs = [await sess.step(hidden[:, :4], 0)]
            outs += [await sess.step(hidden[:, i : i + 1], i) for i in (4, 5)]
            await sess.close()
        assert seen == [(4, 2), (1, 1), (1, 1)], seen
        assert torch.get_num_threads() == 2
        # the same outputs as one forward of the whole sequence on torch's threads
        whole = backend.span.forward(hidden)
        assert (torch.cat(outs, dim=1) - whole).abs().max() < 1e-5
        # decode steps of BATCH_ROWS rows or more run on the batch count, fewer on the other
        assert decode["batch_threads"] == 1 and decode["batch_rows"] == BATCH_ROWS
        backend.batch_threads, seen[:] = 2, []
        rows = torch.randn(BATCH_ROWS, 3, backend.hidden_size)
        async with aiohttp.ClientSession() as http:
            for batch in (BATCH_ROWS - 1, BATCH_ROWS):
                sess = await RawSession.open(http, running.url, backend.fingerprint, 0, 2,
                                             max_length=16, batch_size=batch)  # fmt: skip
                await sess.step(rows[:batch, :2], 0)
                await sess.step(rows[:batch, 2:], 2)
                await sess.close()
        assert [n for _, n in seen] == [2, 1, 2, 2], seen  # prompts on torch's own
    finally:
        await running.stop()


async def test_measured_where_not_chosen(tiny_llama, two_threads) -> None:
    running = await start_block_server(tiny_llama, 0, 2, decode_threads=None)
    try:
        decode = running.server.describe().to_wire()["decode"]
        assert decode["threads_reason"] == "measured after pauses", decode
        assert set(decode["threads_ms"]) == {"2", "1"}, decode
        assert set(decode["batch_threads_ms"]) == {"2", "1"}, decode
        backend = running.server.backend
        assert decode["threads"] == backend.decode_threads in (1, 2)
        assert decode["batch_threads"] == backend.batch_threads in (1, 2)
        assert torch.get_num_threads() == 2
    finally:
        await running.stop()
    kept = await start_block_server(tiny_llama, 0, 2)  # the harness: torch's own (0)
    try:
        decode = kept.server.describe().to_wire()["decode"]
        assert decode["threads"] == 2 and decode["threads_reason"] == "torch's own"
        assert decode["batch_threads"] == 2 and "threads_ms" not in decode
        assert "batch_threads_ms" not in decode
    finally:
        await kept.stop()
