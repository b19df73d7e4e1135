"""install.sh and the Dockerfile install the versions uv.lock pins: `uv export --frozen`
(torch and its CUDA wheels pruned), torch from the device's index at the lock's version, then
the rest as pinned, then DRIFT with --no-deps. The export commands install.sh prints are run
for real (offline) against the checked-in lock."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.install_helpers import plan_of, run_install, uv_command

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def test_dockerfile_installs_from_the_lock() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^COPY pyproject\.toml uv\.lock README\.md \./$", text, re.M)
    assert "uv export --frozen" in text and "--prune torch" in text
    steps = ["-c /tmp/lock-torch.txt", "pip install -r /tmp/lock-without-torch.txt",
             'pip install --no-deps ".[api]"']  # fmt: skip
    assert all(s in text for s in steps), steps
    assert [text.index(s) for s in steps] == sorted(text.index(s) for s in steps)
    assert 'pip install ".[api]"' not in text, "DRIFT's own dependencies come from the lock"
    ignored = [ln for ln in (REPO / ".dockerignore").read_text().splitlines()
               if ln and not ln.startswith("#")]  # fmt: skip
    assert "uv.lock" not in ignored and "*.lock" not in ignored, "the image gets the lock"


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_install_script_plans_from_the_lock(tmp_path: Path, installer: str) -> None:
    proc = run_install(tmp_path, "--dry-run", DRIFT_DEVICE="cpu", DRIFT_INSTALLER=installer)
    assert proc.returncode == 0, proc.stderr
    fields, commands = plan_of(proc.stdout)
    assert fields["lock"] == str(REPO / "uv.lock")
    home = tmp_path / ".local/share/drift"
    exports = [c for c in commands if " export --project " in c]
    assert len(exports) == 2 and all("--frozen" in c for c in exports)
    assert "--prune torch" in exports[1]
    order = [next(i for i, c in enumerate(commands) if marker in c) for marker in
             (" export ", f"-r {home}/lock-without-torch.txt", f"--no-deps {REPO}[api]")]  # fmt: skip
    assert order == sorted(order)
    if installer == "uv":  # pip with a local torch wheel (find-links) takes that wheel as it is
        (torch_cmd,) = [c for c in commands if " torch " in c and "-c " in c]
        assert f"-c {home}/lock-torch.txt" in torch_cmd
        assert "https://download.pytorch.org/whl/cpu" in torch_cmd


def test_a_package_spec_installs_without_the_lock(tmp_path: Path) -> None:
    proc = run_install(tmp_path, "--dry-run", DRIFT_SOURCE="drift-swarm", DRIFT_INSTALLER="uv")
    fields, commands = plan_of(proc.stdout)
    assert fields["lock"].startswith("none") and not any(" export " in c for c in commands)


def test_the_printed_export_commands_work_on_the_lock(tmp_path: Path) -> None:
    uv = uv_command()
    if uv is None:
        pytest.skip("uv is not installed (the dev extra installs it)")
    proc = run_install(tmp_path, "--dry-run", DRIFT_DEVICE="cpu", DRIFT_INSTALLER="uv")
    _, commands = plan_of(proc.stdout)
    (tmp_path / ".local/share/drift").mkdir(parents=True)
    for cmd in commands:
        if " export --project " in cmd:
            argv = [*uv, *shlex.split(cmd)[1:]]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                                  env=dict(os.environ, UV_OFFLINE="1"))  # fmt: skip
            assert done.returncode == 0, done.stderr
        elif cmd.startswith("sh -c "):
            subprocess.run(["sh", "-c", cmd[len("sh -c ") :]], check=True, timeout=30)
    home = tmp_path / ".local/share/drift"
    rest = (home / "lock-without-torch.txt").read_text()
    assert not re.search(r"^(torch|triton|nvidia-)", rest, re.M), "torch's CUDA wheels pruned"
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    versions = {p["name"]: p["version"] for p in lock["package"]}
    for name in ("aiohttp", "safetensors", "llguidance"):
        assert f"{name}=={versions[name]}" in rest, name
    torch_versions = sorted(p["version"] for p in lock["package"] if p["name"] == "torch")
    pins = (home / "lock-torch.txt").read_text()
    assert sorted(re.findall(r"^torch==(\S+)", pins, re.M)) == torch_versions
