"""A script that creates a model, generates, keeps a remote cache and a session open, and
ends without closing anything prints nothing at exit (as a local model), and the servers
free its sessions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = """
import sys
import torch
from drift.client import AutoDistributedModelForCausalLM

model = AutoDistributedModelForCausalLM.from_pretrained(sys.argv[1], initial_peers=sys.argv[2])
ids = torch.tensor([[1, 2, 3]])
print(model.generate(ids, max_new_tokens=3, do_sample=False).tolist())
out = model(ids, use_cache=True)                      # a remote cache, never closed
out = model(torch.tensor([[4]]), cache=out.cache)
session = model.open_session(max_length=8)           # an explicit session, never closed
model.generate(ids, max_new_tokens=2, session=session)
print("done")
"""


def test_script_that_never_closes_prints_nothing_at_exit(swarm, bg_swarms, model_dir: Path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path.cwd()))
    run = subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-c", SCRIPT, str(model_dir),
         swarm.token],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "done"
    assert run.stderr == "", run.stderr  # no warning, no traceback, nothing
    deadline = time.monotonic() + 10
    while bg_swarms.open_sessions(swarm) != [0, 0]:
        assert time.monotonic() < deadline, "the servers still hold the script's sessions"
        time.sleep(0.05)
