"""The server's decode unit: the lean step (drift.models.static_step), compiled or not.

`--compile on` runs plain decode steps (one token per row) through the lean step with its dense
parts compiled by torch.compile (inductor); `auto` (the default) compiles on accelerators only
and runs the lean step uncompiled on a CPU (measured there: compiling buys ~nothing for ~40 s,
and bf16 spans ran slower lean, so they stay eager; scripts/bench_kernels.py); `off` keeps the
eager transformers path. A span the lean step does not cover runs eagerly whatever the setting.
Compiling happens in `warm_up` (at start-up, on the compute thread, logged, shown in /blocks),
never inside a user's first step.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from drift.models.batch import BatchStep
from drift.models.lean_layers import parts_of
from drift.models.session import SpanSession
from drift.models.static_step import LeanDecoder, refusal, relayout_linears

log = logging.getLogger(__name__)

COMPILE_MODES = ("auto", "on", "off")
WARM_BATCHES = (1, 2)  # rows of the warm-up steps: a batch of 1 and one dynamic-size batch


@dataclass(frozen=True)
class DecodeStatus:
    """What /blocks shows: how decode steps run here, and what compiling cost."""

    mode: str  # eager | lean | compiled
    reason: str  # why that mode (the setting, or what refused it)
    compile_s: float | None = None  # seconds warm_up took (None: not run yet)

    def to_wire(self) -> dict[str, Any]:
        return {"mode": self.mode, "reason": self.reason, "compile_s": self.compile_s}


def compiler_found() -> bool:
    return shutil.which("g++") is not None or shutil.which("c++") is not None


class DecodeUnit:
    """Plain decode steps of a span: lean (maybe compiled) where it can, `None` from `build`
    where the eager path stays."""

    def __init__(self, span: Any, compiled: bool) -> None:
        self.span = span
        self.compiled = compiled
        # float32 CPU weights stored [in, out] only where compiled (--compile on): the layout
        # also changes the prefill products' summation order, moving SmolLM2's logits by
        # 1.2e-4, past the 1e-4 the default path keeps with local transformers
        self.relaid = relayout_linears(span) if compiled else 0
        if compiled:
            parts = parts_of(span)
            pre = torch.compile(parts.pre, dynamic=True, fullgraph=True)
            post = torch.compile(parts.post, dynamic=True, fullgraph=True)
            self.decoder = LeanDecoder(span, replace(parts, pre=pre, post=post))
        else:
            self.decoder = LeanDecoder(span)
        self.status = DecodeStatus("compiled" if compiled else "lean", "", None)

    @classmethod
    def build(cls, span: Any, setting: str, quant: str = "none") -> tuple[DecodeUnit | None,
                                                                          DecodeStatus]:  # fmt: skip
        """The unit for `setting` (auto|on|off), or None and why the eager path stays."""
        if setting not in COMPILE_MODES:
            raise ValueError(f"--compile {setting!r}: use one of {', '.join(COMPILE_MODES)}")
        if setting == "off":
            return None, DecodeStatus("eager", "--compile off")
        why = refusal(span, quant)
        if why is not None:
            log.info("decode steps run eagerly: the lean step does not cover %s", why)
            return None, DecodeStatus("eager", f"not covered: {why}")
        if setting == "auto" and span.device.type == "cpu" and span.dtype != torch.float32:
            # measured (scripts/bench_kernels.py, SmolLM2 bf16 0:15): the lean step ran 0.65x
            # of eager there, so a CPU keeps half-precision spans eager unless asked
            return None, DecodeStatus("eager", "--compile auto: half precision on a CPU")
        if setting == "on" and span.device.type == "cpu" and not compiler_found():
            raise ValueError("--compile on needs a C++ compiler on a CPU (inductor); none found")
        compiled = setting == "on" or span.device.type != "cpu"
        unit = cls(span, compiled)
        reason = f"--compile {setting}" + ("" if compiled else ": lean step, uncompiled on a CPU")
        unit.status = DecodeStatus(unit.status.mode, reason)
        return unit, unit.status

    def takes(self, steps: Sequence[BatchStep]) -> bool:
        return self.decoder.takes(steps)

    def run(self, steps: Sequence[BatchStep]) -> list[torch.Tensor]:
        return self.decoder.run(steps)

    def warm_up(self) -> DecodeStatus:
        """Run decode steps on scratch sessions (compiling the parts); on the compute thread."""
        started = time.perf_counter()
        hidden = int(self.span.config.hidden_size)
        for rows in WARM_BATCHES:
            sessions = [SpanSession(self.span, self.span.start_block, self.span.end_block,
                                    batch_size=1, max_length=8) for _ in range(rows)]  # fmt: skip
            for position in range(2):  # an empty past, then one token of past
                steps = [BatchStep(s, position, torch.zeros(1, 1, hidden, dtype=self.span.dtype))
                         for s in sessions]  # fmt: skip
                self.run(steps)
            for s in sessions:
                s.close()
        took = time.perf_counter() - started
        self.status = DecodeStatus(self.status.mode, self.status.reason, round(took, 3))
        log.info("decode steps: %s (%s), warm-up took %.1f s", self.status.mode,
                 self.status.reason, took)  # fmt: skip
        return self.status


def attach_decode(backend: Any, setting: str) -> DecodeStatus:
    """Give `backend` (drift.server.backend.SpanBackend) its decode unit for `setting`, warmed
    up (compiled) on its compute thread now, before it serves; returns what /blocks shows."""
    unit, status = DecodeUnit.build(backend.span, setting, backend.quant)
    if unit is not None:
        log.info("decode steps: %s; warming up%s", status.mode,
                 " (compiling: this takes a while)" if unit.compiled else "")  # fmt: skip
        status = backend.executor.submit(unit.warm_up).result()
    backend.decode = unit
    backend.decode_status = status.to_wire()
    return status
