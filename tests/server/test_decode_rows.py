"""Row padding of batched decode steps (drift.server.decode_rows): measured at start-up on a
real-size span's own weights and applied by its lean decode unit, not measured where the
weights fit in the caches; /blocks shows the table. (That padded steps equal unpadded ones:
tests/models/test_static_step.py; the chooser: tests/models/test_rows.py.)"""

from __future__ import annotations

from pathlib import Path

import torch

from drift.models import rows
from drift.models.checkpoint import open_checkpoint
from tests.server.harness import start_block_server


async def test_a_real_size_span_measures_its_row_pads(smollm2_cache) -> None:
    path = Path(open_checkpoint("smollm2", cache_dir=smollm2_cache, dtype=torch.float32).path)
    running = await start_block_server(path, 0, 4)  # ~56 MiB of linear weights
    try:
        decode = running.server.describe().to_wire()["decode"]
        assert decode["mode"] == "lean" and decode["row_pads_reason"] == "measured", decode
        assert decode["products"].startswith("DRIFT's row kernel"), decode  # measured on it
        medians = {int(m): ms for m, ms in decode["rows_ms"].items()}
        assert sorted(medians) == list(range(1, rows.MAX_ROWS + 1))
        pads = {int(m): to for m, to in decode["row_pads"].items()}
        for m, to in pads.items():  # each pad to a clearly faster count, as measured
            assert m < to and medians[to] <= (1 - rows.GAIN) * medians[m] + 0.01
        assert running.server.backend.decode.decoder.row_pads == pads
    finally:
        await running.stop()


async def test_small_weights_are_not_measured(tiny_llama) -> None:
    running = await start_block_server(tiny_llama, 0, 2)
    try:
        decode = running.server.describe().to_wire()["decode"]
        assert decode["row_pads"] == {} and "caches" in decode["row_pads_reason"], decode
        assert "rows_ms" not in decode
        assert running.server.backend.decode.decoder.row_pads == {}
    finally:
        await running.stop()
