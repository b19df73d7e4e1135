"""Hypothesis profiles for the fuzz suite: a few seconds per target in the normal run,
thousands of examples with DRIFT_FUZZ=long (e.g. `DRIFT_FUZZ=long pytest tests/fuzz`)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "drift-ci", max_examples=60, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
settings.register_profile(
    "drift-long", max_examples=5000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
settings.load_profile("drift-long" if os.environ.get("DRIFT_FUZZ") == "long" else "drift-ci")
