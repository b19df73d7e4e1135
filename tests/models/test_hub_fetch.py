"""Hub checkpoints through a real HTTP Hub on loopback (tests/models/fake_hub.py).

Every "machine" is its own process with its own Hugging Face cache (HF_HOME) and token (how
the fake Hub tells them apart), talking to the Hub through HF_ENDPOINT as huggingface_hub
does. The model is a tiny llama in three shards, one per two blocks plus one for the client
pieces, like a big checkpoint's few-blocks-per-shard layout. Bytes are counted by the Hub.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.models.fake_hub import FakeHub
from tests.procs import DriftProc
from tests.tiny_models import build_tiny

REPO = "org/tiny"
CLIENT_SHARD, SHARD_01, SHARD_23 = (f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))
META = ["config.json", "generation_config.json", "model.safetensors.index.json"]


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory) -> Path:
    """The tiny llama as a sharded checkpoint: client pieces | blocks 0-1 | blocks 2-3."""
    directory = tmp_path_factory.mktemp("repo")
    model = build_tiny("llama")
    model.config.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)
    state = model.state_dict()
    shards: dict[str, dict[str, torch.Tensor]] = {CLIENT_SHARD: {}, SHARD_01: {}, SHARD_23: {}}
    for name, tensor in state.items():
        layer = re.match(r"model\.layers\.(\d+)\.", name)
        shard = CLIENT_SHARD if layer is None else (SHARD_01 if int(layer[1]) < 2 else SHARD_23)
        shards[shard][name] = tensor.contiguous()
    for shard, tensors in shards.items():
        save_file(tensors, str(directory / shard), metadata={"format": "pt"})
    weight_map = {n: s for s, tensors in shards.items() for n in tensors}
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return directory


@pytest.fixture
def hub(repo_dir: Path):
    hub = FakeHub().start()
    hub.add_repo(REPO, repo_dir)
    hub.add_repo("org/gated", repo_dir, gated_for={"hf_accepted"})
    yield hub
    hub.stop()


def machine_env(hub: FakeHub, home: Path, token: str) -> dict[str, str]:
    """What one machine's processes see: its own HF cache and login, the loopback Hub."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    return dict(env, HF_ENDPOINT=hub.url, HF_HOME=str(home), HF_TOKEN=token, HF_HUB_OFFLINE="0",
                HF_HUB_DISABLE_PROGRESS_BARS="1", OMP_NUM_THREADS="1",
                PYTHONPATH=str(Path.cwd()))  # fmt: skip


def run_py(env: dict[str, str], code: str, timeout: float = 120) -> str:
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


SERVER = """
from drift.models.checkpoint import open_checkpoint
from drift.models.span import ModelSpan
span = ModelSpan.load(open_checkpoint({repo!r}), {start}, {end})
print("loaded", span.start_block, span.end_block)
"""
CLIENT = """
from drift.models.checkpoint import open_checkpoint
from drift.models.head import ClientHead
ckpt = open_checkpoint({repo!r}, blocks=range(0))  # what the client SDK opens
head = ClientHead.load(ckpt)
print("head", tuple(head.embed_tokens.weight.shape))
"""


def test_each_machine_downloads_only_its_shards(hub: FakeHub, tmp_path: Path) -> None:
    server_a = machine_env(hub, tmp_path / "a", "hf_server_a")
    server_b = machine_env(hub, tmp_path / "b", "hf_server_b")
    client = machine_env(hub, tmp_path / "c", "hf_client")
    assert "loaded 0 2" in run_py(server_a, SERVER.format(repo=REPO, start=0, end=2))
    assert "loaded 2 4" in run_py(server_b, SERVER.format(repo=REPO, start=2, end=4))
    assert "head (256, 64)" in run_py(client, CLIENT.format(repo=REPO))
    sizes = {name: (hub_file(hub, name)) for name in [*META, CLIENT_SHARD, SHARD_01, SHARD_23]}
    expected = {
        "hf_server_a": [*META, SHARD_01],
        "hf_server_b": [*META, SHARD_23],
        "hf_client": [*META, CLIENT_SHARD],
    }
    for token, files in expected.items():
        assert sorted(hub.files_sent[token]) == sorted(files), token
        assert hub.bytes_sent[token] == sum(sizes[f] for f in files), token
    total = sum(sizes.values())
    print(f"\nbytes: server a {hub.bytes_sent['hf_server_a']}, server b "
          f"{hub.bytes_sent['hf_server_b']}, client {hub.bytes_sent['hf_client']} of {total}")  # fmt: skip

    # A restart (same machine, same cache) fetches nothing.
    before = dict(hub.bytes_sent)
    assert "loaded 0 2" in run_py(server_a, SERVER.format(repo=REPO, start=0, end=2))
    assert dict(hub.bytes_sent) == before


def hub_file(hub: FakeHub, name: str) -> int:
    return len(hub.repos[REPO].files[name])


def test_a_cache_filled_by_huggingface_hub_is_used_as_is(hub: FakeHub, tmp_path: Path) -> None:
    """A model the user already downloaded (hf download / transformers) is not fetched again."""
    env = machine_env(hub, tmp_path / "user", "hf_user")
    run_py(env, f"from huggingface_hub import snapshot_download; snapshot_download({REPO!r})")
    fetched = hub.bytes_sent["hf_user"]
    assert fetched == sum(len(d) for d in hub.repos[REPO].files.values())
    assert "loaded 1 3" in run_py(env, SERVER.format(repo=REPO, start=1, end=3))
    assert "head" in run_py(env, CLIENT.format(repo=REPO))
    assert hub.bytes_sent["hf_user"] == fetched


MOVE = """
import asyncio, sys
from drift.server.build import load_server
from drift.server.config import ServerConfig
server = load_server(ServerConfig(model={repo!r}, start_block=0, end_block=2, throughput=1.0))
print("loaded", flush=True)
sys.stdin.readline()
asyncio.run(server.move_to(1, 4, drain_timeout_s=0))
print("moved", server.backend.start_block, server.backend.end_block, flush=True)
"""


def test_a_span_move_downloads_only_the_new_shards(hub: FakeHub, tmp_path: Path) -> None:
    env = machine_env(hub, tmp_path / "m", "hf_mover")
    proc = subprocess.Popen([sys.executable, "-c", MOVE.format(repo=REPO)], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "loaded"
        assert sorted(hub.files_sent["hf_mover"]) == sorted([*META, SHARD_01])
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split() == ["moved", "1", "4"]
        assert sorted(hub.files_sent["hf_mover"]) == sorted([*META, SHARD_01, SHARD_23])
    finally:
        proc.kill()
        proc.wait(30)


OPEN = """
import os
from drift.models.checkpoint import open_checkpoint
from drift.wire.errors import DriftError
for repo, revision, token in {cases!r}:
    os.environ["HF_TOKEN"] = token  # huggingface_hub reads the token at each call
    try:
        open_checkpoint(repo, revision=revision)
        print("opened")
    except DriftError as exc:
        print(exc.code, exc.message)
"""


def test_gated_missing_and_unknown_revisions_say_what_to_do(hub: FakeHub, tmp_path: Path) -> None:
    cases = [("org/gated", None, ""), ("org/gated", None, "hf_accepted"),
             ("org/nope", None, ""), (REPO, "v9", "")]  # fmt: skip
    gated, accepted, missing, revision = run_py(
        machine_env(hub, tmp_path / "x", ""), OPEN.format(cases=cases)
    ).splitlines()
    assert gated.startswith("forbidden")
    assert "accept its licence on https://huggingface.co/org/gated" in gated
    assert "hf auth login" in gated and "HF_TOKEN" in gated
    assert accepted == "opened"
    assert missing.startswith("not_found") and "check the id" in missing
    assert "hf auth login" in missing  # a private repo looks missing without a login
    assert revision.startswith("not_found") and "has no revision 'v9'" in revision


def test_offline_without_a_cached_copy_is_clear(tmp_path: Path) -> None:
    env = dict(os.environ, HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1", PYTHONPATH=str(Path.cwd()))
    out = run_py(env, OPEN.format(cases=[("no-such-org/no-such-model", None, "")]))
    assert out.startswith("not_found") and "not in the local Hugging Face cache" in out
    assert "HF_HUB_OFFLINE" in out


@pytest.mark.slow
def test_a_swarm_served_from_the_hub(hub: FakeHub, tmp_path: Path, repo_dir: Path) -> None:
    """Two `drift server org/tiny` processes and a client generate what transformers does;
    a restarted server fetches nothing."""
    from transformers import AutoModelForCausalLM

    def server(name: str, span: str, peers: str | None = None) -> DriftProc:
        args = ["server", REPO, "--block_indices", span, "--host", "127.0.0.1", "--port", "0",
                "--throughput", "100", "--device", "cpu", "--torch_dtype", "float32",
                "--cache_dir", str(tmp_path / name)]  # fmt: skip
        proc = DriftProc(args + (["--initial_peers", peers] if peers else []),
                         machine_env(hub, tmp_path / name, f"hf_{name}"))  # fmt: skip
        started.append(proc)
        return proc

    started: list[DriftProc] = []
    try:
        a = server("a", "0:2")
        token = a.wait_for(r"join token: (drift://\S+)").group(1)
        b = server("b", "2:4", token)
        b.wait_for(r"join token: ")
        code = f"""
import torch, time
from drift.client import AutoDistributedModelForCausalLM
model = AutoDistributedModelForCausalLM.from_pretrained({REPO!r}, initial_peers={token!r})
for _ in range(100):
    try:
        out = model.generate(torch.tensor([[1, 5, 9, 77]]), max_new_tokens=6, do_sample=False)
        break
    except Exception:  # until gossip has spread server b's record
        time.sleep(0.2)
print("tokens", out[0].tolist())
model.close()
"""
        out = run_py(machine_env(hub, tmp_path / "client", "hf_client"), code, timeout=180)
        local = AutoModelForCausalLM.from_pretrained(repo_dir, dtype=torch.float32).eval()
        want = local.generate(torch.tensor([[1, 5, 9, 77]]), max_new_tokens=6, do_sample=False)
        assert f"tokens {want[0].tolist()}" in out
        assert sorted(hub.files_sent["hf_a"]) == sorted([*META, SHARD_01])
        assert sorted(hub.files_sent["hf_b"]) == sorted([*META, SHARD_23])
        assert sorted(hub.files_sent["hf_client"]) == sorted([*META, CLIENT_SHARD])
        a.kill()
        before = dict(hub.bytes_sent)
        server("a", "0:2").wait_for(r"join token: ")
        assert dict(hub.bytes_sent) == before
    finally:
        for proc in started:
            proc.kill()
