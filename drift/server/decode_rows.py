"""Row padding of a CPU server's batched decode steps: measured at start-up on the span's own
weights (drift.models.rows), on the threads decode steps of each row count run on
(drift.server.decode_threads).

Two or three sessions stepping together (two users of `drift api`, concurrent generate()
calls) are common; MKL reads a float32 weight once per row for 2-3 rows and once for 4. The
lean decode step (drift.models.static_step) pads its rows per the table. Spans whose decode
steps run eagerly, off the CPU, or through experts (a zero row would still be routed to some)
are not padded. /blocks shows the table under decode.row_pads.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from drift.models.row_kernel import activated, product_of
from drift.models.rows import measure

log = logging.getLogger(__name__)

EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")


def attach_row_pads(backend: Any) -> dict[str, Any]:
    """Measure and set the row pads of `backend`'s lean decode unit (drift.server.compiled)
    on its compute thread; returns what /blocks shows of it."""
    unit, span = backend.decode, backend.span
    why = _refusal(unit, span)
    if why is not None:
        return {"row_pads": {}, "row_pads_reason": why}
    linears = [m for m in span.layers.modules() if type(m) is torch.nn.Linear]
    weights = [m.weight for m in linears]
    product = product_of(linears[0]) if linears else torch.nn.functional.linear

    def run() -> tuple[dict[int, int], dict[int, float]]:
        with activated(backend.row_kernel):  # as decode steps compute them, on their threads
            return measure(weights, product=product, threads_for=backend.step_threads)

    pads, medians = backend.executor.submit(run).result()
    unit.decoder.row_pads = pads
    if not medians:
        return {"row_pads": {}, "row_pads_reason": "weights small enough for the CPU's caches"}
    log.info("decode steps of 1-%d rows: a pass over the span's weights took %s; padded %s",
             len(medians), ", ".join(f"{s * 1e3:.1f}" for s in medians.values()),
             pads or "none")  # fmt: skip
    return {"row_pads": {str(m): to for m, to in pads.items()}, "row_pads_reason": "measured",
            "rows_ms": {str(m): round(s * 1e3, 2) for m, s in medians.items()}}  # fmt: skip


def _refusal(unit: Any, span: Any) -> str | None:
    if unit is None:
        return "decode steps run eagerly"
    if span.device.type != "cpu":
        return "an accelerator's step"
    if any(getattr(span.config, name, None) for name in EXPERT_FIELDS):
        return "experts: a zero row would be routed to some"
    return None
