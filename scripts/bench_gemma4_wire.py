"""Bytes shipped per decode step for Gemma 4: per-layer inputs and shared keys/values.

For a split of the model into spans, builds the exact step frames the SDK sends and the
servers answer (drift.wire.messages, with what drift.client.extras puts in them) for one
new token, and prints per hop: the request and reply bytes, the part that is per-layer
inputs and the part that is shared K/V, against the same frames without them (what any
other family of this hidden size ships). Two models: the tiny test config and one shaped
like google/gemma-4-E2B (hidden 1536, 35 blocks, per-layer inputs of 256, the last 20
blocks reuse the K/V of blocks 13 and 14; numbers from its config.json, no weights).

    .venv/bin/python scripts/bench_gemma4_wire.py [--dtype bfloat16] [--batch 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from drift.client.extras import hop_extras  # noqa: E402
from drift.models.registry import get_adapter  # noqa: E402
from drift.wire import messages as m  # noqa: E402
from drift.wire.extras import PER_LAYER_INPUTS, concrete  # noqa: E402
from tests.tiny_models import tiny_config  # noqa: E402

E2B_TEXT = dict(
    hidden_size=1536, intermediate_size=6144, num_hidden_layers=35, num_attention_heads=8,
    num_key_value_heads=1, head_dim=256, global_head_dim=512, sliding_window=512,
    vocab_size=262144, vocab_size_per_layer_input=262144, hidden_size_per_layer_input=256,
    num_kv_shared_layers=20, use_double_wide_mlp=True, final_logit_softcapping=30.0,
    layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
)  # fmt: skip
MODELS = {
    "tiny (tests/tiny_models.py gemma4_text)": (
        tiny_config("gemma4_text"),
        {"3 spans 0:3|3:5|5:6": [3, 5], "cut 0:4|4:6": [4], "no cut 0:2|2:6": [2]},
    ),
    "Gemma-4-E2B-shaped": (
        AutoConfig.for_model("gemma4_text", **E2B_TEXT),
        {
            "cut 0:15|15:35": [15],
            "3 spans 0:12|12:24|24:35": [12, 24],
            "no cut 0:10|10:35": [10],
        },
    ),
}


def _frame_bytes(message: object) -> int:
    return len(m.encode(message))


def measure(config: object, cuts: list[int], dtype: torch.dtype, batch: int) -> list[dict]:
    """Per hop of one decode step: bytes of the request/reply and of what is in them."""
    adapter = get_adapter(config)
    n, hidden_size = adapter.num_layers, adapter.hidden_size
    hidden = torch.zeros(batch, 1, hidden_size, dtype=dtype)
    per_layer = None
    if adapter.per_layer:
        per_layer = torch.zeros(batch, 1, n, adapter.per_layer, dtype=dtype)
    bounds = [0, *cuts, n]
    shared: dict[str, torch.Tensor] = {}
    rows = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        extras = hop_extras(adapter.sharing, 0, a, b, per_layer, shared)
        donate = adapter.sharing.donated(a, b, n)
        spec = adapter.extra_spec(a, b)
        donated = {
            name: torch.zeros(concrete(shape, batch, 1), dtype=dtype)
            for name, shape in spec.outputs(donate)
        }
        shared.update(donated)
        request = m.StepRequest(1, 100, hidden, extras=extras, donate=donate)
        reply = m.StepResponse(1, hidden, donated)
        plain = _frame_bytes(m.StepRequest(1, 100, hidden)) + _frame_bytes(
            m.StepResponse(1, hidden)
        )
        ple = extras.get(PER_LAYER_INPUTS)
        kv_in = sum(
            t.numel() * t.element_size() for k, t in extras.items() if k != PER_LAYER_INPUTS
        )
        rows.append(
            dict(
                hop=f"[{a},{b})",
                request=_frame_bytes(request),
                reply=_frame_bytes(reply),
                plain=plain,
                ple=0 if ple is None else ple.numel() * ple.element_size(),
                kv_in=kv_in,
                kv_out=sum(t.numel() * t.element_size() for t in donated.values()),
            )
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"one decode step (1 new token x batch {args.batch}), activations in {args.dtype}; "
          "bytes are whole frames (safetensors header + metadata + data)")  # fmt: skip
    for model, (config, splits) in MODELS.items():
        print(f"\n{model}")
        for split, cuts in splits.items():
            rows = measure(config, cuts, dtype, args.batch)
            total = sum(r["request"] + r["reply"] for r in rows)
            plain = sum(r["plain"] for r in rows)
            ple = sum(r["ple"] for r in rows)
            kv = sum(r["kv_in"] + r["kv_out"] for r in rows)
            print(f"  {split}: {total} B per step vs {plain} B without extras "
                  f"(x{total / plain:.2f}); per-layer inputs {ple} B, shared K/V {kv} B "
                  "(donor -> client -> consumer)")  # fmt: skip
            for r in rows:
                print(f"    {r['hop']:>8}: request {r['request']:>6} B, reply {r['reply']:>6} B; "
                      f"per-layer inputs {r['ple']:>6} B, K/V in {r['kv_in']:>5} B, "
                      f"K/V out {r['kv_out']:>5} B")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
