"""drift's commands bound OpenMP's spinning before torch loads (drift/openmp.py), unless
the user chose a spin count or wait policy; scripts/bench_spin.py measures why."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from drift.openmp import bound_spinning

_PROBE = """
import os, sys
from drift.cli.main import main
try:
    main(["--version"])
except SystemExit:
    pass
print(os.environ.get("GOMP_SPINCOUNT"), "torch" in sys.modules)
"""


def test_bound_unless_the_user_chose_or_torch_is_loaded() -> None:
    env: dict[str, str] = {}
    assert bound_spinning(env, loaded=False) and env == {"GOMP_SPINCOUNT": "10000"}
    for user in ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "active"}):
        env = dict(user)
        assert not bound_spinning(env, loaded=False) and env == user
    env = {}
    assert not bound_spinning(env, loaded=True) and env == {}  # libgomp read it already


@pytest.mark.parametrize("user", [None, "passive"])
def test_the_cli_sets_it_before_its_commands_import_torch(user) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    if user:
        env["OMP_WAIT_POLICY"] = user
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, check=True, timeout=120)  # fmt: skip
    spins, torch_loaded = out.stdout.split()[-2:]
    assert torch_loaded == "True"  # the commands' modules import torch: too late after them
    assert spins == ("None" if user else "10000")
