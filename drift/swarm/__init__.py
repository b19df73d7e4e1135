"""Swarm membership as data, on both sides of the wire: signed records, the merged table,
coverage and /blocks documents, block selection, span notation, and the one reader of a
swarm's table (reader.py, the only module here that does I/O).

Everything else is pure functions and plain objects with no clock of its own (callers pass
`now`).
"""

from drift.swarm.blocks import BlocksInfo
from drift.swarm.coverage import (
    BlockCoverage,
    Coverage,
    ModelInfo,
    all_coverages,
    block_peers,
    block_throughputs,
    coverage,
    missing_blocks,
    models_in,
    records_for_model,
    serving_records,
)
from drift.swarm.record import PeerRecord, canonical_bytes, default_fields, sign_record
from drift.swarm.selection import (
    balance_ratio,
    choose_rebalance,
    choose_span,
)
from drift.swarm.spans import format_ranges, format_span, parse_span
from drift.swarm.table import MembershipTable

__all__ = [
    "BlockCoverage",
    "BlocksInfo",
    "Coverage",
    "MembershipTable",
    "ModelInfo",
    "PeerRecord",
    "all_coverages",
    "balance_ratio",
    "block_peers",
    "block_throughputs",
    "canonical_bytes",
    "choose_rebalance",
    "choose_span",
    "coverage",
    "default_fields",
    "format_ranges",
    "format_span",
    "missing_blocks",
    "models_in",
    "parse_span",
    "records_for_model",
    "serving_records",
    "sign_record",
]
