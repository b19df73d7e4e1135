"""Swarm membership as data: signed records, the merged table, coverage, block selection.

Pure functions and plain objects; no HTTP, no clock of its own (callers pass `now`).
"""

from drift.swarm.coverage import (
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
    should_rebalance,
)
from drift.swarm.table import MembershipTable

__all__ = [
    "MembershipTable",
    "PeerRecord",
    "balance_ratio",
    "block_peers",
    "block_throughputs",
    "canonical_bytes",
    "choose_rebalance",
    "choose_span",
    "coverage",
    "default_fields",
    "missing_blocks",
    "models_in",
    "records_for_model",
    "serving_records",
    "should_rebalance",
    "sign_record",
]
