"""Converting the SmolLM2 GGUF streams: the converting process's RSS rises by less than 2x
the bfloat16 output at its peak (measured in a fresh process; slow)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_smollm2_conversion_peak_rss_is_below_twice_the_output() -> None:
    spec = importlib.util.spec_from_file_location(
        "bench_convert", REPO / "scripts/bench_convert.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    m = bench.convert_in_child("smollm2", "bfloat16")
    rise, output = m["peak"] - m["before"], m["weights"]
    print(f"\nSmolLM2 -> bfloat16: {output / 2**20:.1f} MiB written, RSS {m['before'] / 2**20:.0f}"
          f" -> peak {m['peak'] / 2**20:.0f} MiB (+{rise / 2**20:.0f} MiB, {rise / output:.2f}x)")  # fmt: skip
    assert 0.49 < output / (134.5e6 * 4) < 0.51  # bfloat16: half of float32's bytes
    assert rise < 2 * output
