"""Hypothesis strategies the fuzz targets share."""

from __future__ import annotations

from hypothesis import strategies as st

json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30,
)  # fmt: skip
