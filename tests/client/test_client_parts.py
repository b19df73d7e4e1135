"""Clients with no copy of the model: the swarm serves its client parts (drift.server.parts)
and the SDK downloads, verifies and caches them (drift.client.parts, drift.client.resolve).

Real servers on loopback; the client opens the model by the name the swarm announces, from
an empty cache dir, and must agree with local transformers on the same weights."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from pathlib import Path

import aiohttp
import pytest
import torch

from drift.client import AutoDistributedModelForCausalLM
from drift.client.loading import load_parts, open_client_model
from drift.client.parts import Source, cached_parts, fetch_parts, parts_dir
from drift.client.resolve import _parts_checkpoint
from drift.models.checkpoint import open_checkpoint
from drift.models.client_files import client_tensor_names
from drift.models.head import ClientHead
from drift.server.parts import prepare_parts
from drift.wire.errors import MissingBlocks, ModelMismatch, NotFound, PeerUnavailable
from drift.wire.parts import PartsManifest, parts_path
from tests.server.reference import load_reference
from tests.tiny_models import GEMMA4_FAMILIES, save_tiny


def _named(tiny_dirs, family: str, root: Path, name: str) -> Path:
    """A copy of the tiny `family` checkpoint in a directory called `name` (its display name)."""
    target = root / name
    if not target.exists():
        shutil.copytree(tiny_dirs(family), target)
    return target


@pytest.mark.parametrize("family", ["llama", "gemma2", "bloom", "falcon", *GEMMA4_FAMILIES])
def test_parts_hold_what_the_client_head_reads(tmp_path, family):
    """Each family's parts alone load a ClientHead equal to one loaded from the checkpoint,
    and hold no block tensor."""
    model_dir = save_tiny(family, tmp_path / family)
    ckpt = open_checkpoint(model_dir)
    parts = prepare_parts(ckpt, tmp_path / "server-cache")
    names = client_tensor_names(ckpt)
    assert names and not [n for n in names if ".layers." in n or ".h." in n]
    only = _parts_checkpoint(parts.directory, parts.manifest)
    assert only.fingerprint == ckpt.fingerprint and only.tensor_names() == names
    full, served = ClientHead.load(ckpt), ClientHead.load(only)
    for (name, a), (_, b) in zip(full.state_dict().items(), served.state_dict().items(),
                                 strict=True):  # fmt: skip
        assert torch.equal(a, b), name


def test_prepared_once_and_rebuilt_when_the_checkpoint_changes(tmp_path, tiny_dirs):
    model_dir = _named(tiny_dirs, "llama", tmp_path, "m")
    cache = tmp_path / "server-cache"
    first = prepare_parts(open_checkpoint(model_dir), cache)
    again = prepare_parts(open_checkpoint(model_dir), cache)
    assert again.directory == first.directory and again.manifest == first.manifest
    for f in first.manifest.files:
        data = (first.directory / f.name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f.sha256 and len(data) == f.size
    (model_dir / "generation_config.json").write_text('{"max_length": 7}')
    changed = prepare_parts(open_checkpoint(model_dir), cache)
    assert changed.directory != first.directory


async def test_from_pretrained_by_the_announced_name_with_no_local_copy(
    tmp_path, tiny_dirs, swarms, sdk_models
):
    """`from_pretrained('acme-tiny', initial_peers=...)` where no 'acme-tiny' exists here:
    the parts come from the swarm into an empty cache dir, logits and greedy tokens equal
    local transformers', and a second open reads nothing from the network."""
    model_dir = _named(tiny_dirs, "llama", tmp_path / "models", "acme-tiny")
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)], parts_cache=tmp_path / "srv")
    client_cache = tmp_path / "client-cache"
    model = await sdk_models.open("acme-tiny", swarm.token, cache_dir=client_cache)
    assert model.client.origin.where.startswith("the swarm (client parts from ")
    local = load_reference(model_dir)
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(0))

    def check() -> None:
        with torch.no_grad():
            assert (model(ids).logits - local(ids).logits).abs().max() < 1e-4
        ref = local.generate(ids, max_new_tokens=6, do_sample=False)
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), ref)

    await asyncio.to_thread(check)
    manifest = cached_parts(client_cache, swarm.fingerprint)
    assert manifest is not None and manifest.model == "acme-tiny"
    again = await asyncio.to_thread(open_client_model, swarm.fingerprint,
                                    cache_dir=client_cache)  # no peers: the cache alone  # fmt: skip
    assert again.fetched is None and again.ckpt.fingerprint == swarm.fingerprint
    left_out = await sdk_models.open(None, swarm.token, cache_dir=client_cache)  # the only one
    assert left_out.client.model_fingerprint == swarm.fingerprint


async def test_a_private_swarm_serves_parts_only_to_key_holders(
    tmp_path, tiny_dirs, swarms, sdk_models
):
    model_dir = _named(tiny_dirs, "llama", tmp_path / "models", "acme-private")
    swarm = await swarms.start(model_dir, [(0, 4)], swarm_key="s3cret",
                               parts_cache=tmp_path / "srv")  # fmt: skip
    async with aiohttp.ClientSession() as http:
        async with http.get(swarm.seed.url + parts_path(swarm.fingerprint)) as resp:
            assert resp.status == 401
    model = await sdk_models.open("acme-private", swarm.token, swarm_key="s3cret",
                                  cache_dir=tmp_path / "client")  # fmt: skip
    assert model.client.model_fingerprint == swarm.fingerprint


async def test_a_download_resumes_and_bad_bytes_are_refused(tmp_path, tiny_dirs, swarms):
    """A .part file left by an interrupted download is resumed with Range (only the rest
    travels); a file whose bytes do not match the manifest's sha256 is dropped, and the
    next server is asked."""
    model_dir = _named(tiny_dirs, "llama", tmp_path / "models", "acme-resume")
    swarm = await swarms.start(model_dir, [(0, 4)], parts_cache=tmp_path / "srv")
    source = Source(swarm.seed.url, swarm.seed.node.peer_id)
    # the same parts prepared apart from the server's cache (which the server may be
    # preparing or swapping in at this moment): the bytes and manifest are the same
    served = prepare_parts(open_checkpoint(model_dir), tmp_path / "mine")
    weights = next(f for f in served.manifest.files if f.name == "model.safetensors")
    cache = tmp_path / "client"
    blobs = parts_dir(cache, swarm.fingerprint) / ".blobs"
    blobs.mkdir(parents=True)
    half = weights.size // 2
    (blobs / f"{weights.sha256}.part").write_bytes(
        (served.directory / weights.name).read_bytes()[:half]
    )
    async with aiohttp.ClientSession() as http:
        got = await fetch_parts(http, [source], swarm.fingerprint, cache, swarm_key=None,
                                verify=_parts_checkpoint)  # fmt: skip
    assert got.bytes_downloaded == served.manifest.total_bytes - half
    assert cached_parts(cache, swarm.fingerprint) == served.manifest

    other = tmp_path / "client2"
    blobs = parts_dir(other, swarm.fingerprint) / ".blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{weights.sha256}.part").write_bytes(b"\0" * half)  # wrong bytes
    async with aiohttp.ClientSession() as http:
        with pytest.raises(PeerUnavailable, match="another sha256"):
            await fetch_parts(http, [source], swarm.fingerprint, other, swarm_key=None,
                              verify=_parts_checkpoint)  # fmt: skip
        assert not (blobs / f"{weights.sha256}.part").exists()  # dropped: the next try is whole
        await fetch_parts(http, [source], swarm.fingerprint, other, swarm_key=None,
                          verify=_parts_checkpoint)  # fmt: skip
    assert cached_parts(other, swarm.fingerprint) == served.manifest


def test_parts_whose_config_is_another_model_are_refused(tmp_path, tiny_dirs):
    """The assembled directory must have the fingerprint it was served as."""
    model_dir = _named(tiny_dirs, "llama", tmp_path, "m")
    parts = prepare_parts(open_checkpoint(model_dir), tmp_path / "srv")
    lie = PartsManifest(parts.manifest.model, "0" * 64, None, parts.manifest.files)
    with pytest.raises(ModelMismatch, match="fingerprint"):
        _parts_checkpoint(parts.directory, lie)


async def test_another_local_checkpoint_is_refused_naming_both(tmp_path, tiny_dirs, swarms):
    """A client whose own copy differs from what the swarm serves fails at once, naming both
    models, both fingerprints and where each came from, and the fix."""
    served_dir = _named(tiny_dirs, "llama", tmp_path / "served", "acme-chat")
    other_dir = tmp_path / "mine" / "acme-chat"  # the same name, another checkpoint
    save_tiny("qwen2", other_dir)
    swarm = await swarms.start(served_dir, [(0, 4)])
    with pytest.raises(ModelMismatch) as info:
        await asyncio.to_thread(load_parts, str(other_dir), initial_peers=swarm.token,
                                cache_dir=tmp_path / "c")  # fmt: skip
    text = info.value.message
    mine = open_checkpoint(other_dir).fingerprint
    assert mine[:16] in text and swarm.fingerprint in text, text
    assert str(other_dir.resolve()) in text and "'acme-chat'" in text
    assert "same name, another checkpoint" in text and "no server covers" not in text


async def test_unknown_name_says_what_the_swarm_serves(tmp_path, tiny_dirs, swarms):
    model_dir = _named(tiny_dirs, "llama", tmp_path, "acme-known")
    swarm = await swarms.start(model_dir, [(0, 4)], parts_cache=tmp_path / "srv")
    with pytest.raises(NotFound, match="no model named 'acme-unknown'.*'acme-known'"):
        await asyncio.to_thread(
            AutoDistributedModelForCausalLM.from_pretrained, "acme-unknown",
            initial_peers=swarm.token, cache_dir=tmp_path / "c",
        )  # fmt: skip


def test_a_partial_hub_checkpoint_prepares_only_when_asked(tmp_path):
    """Preparing at start would fetch the shard of the embeddings, which a server of later
    blocks does not need: with that shard absent, preparation waits for the first request."""
    from drift.models.checkpoint import Checkpoint
    from drift.server.parts import client_shards_on_disk
    from tests.tiny_models import build_tiny

    model_dir = tmp_path / "sharded"
    build_tiny("llama").save_pretrained(model_dir, max_shard_size="100KB")
    ckpt = Checkpoint(model_dir)
    assert client_shards_on_disk(ckpt)
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    (model_dir / index["weight_map"]["model.embed_tokens.weight"]).unlink()
    assert not client_shards_on_disk(Checkpoint(model_dir, partial=True))


async def test_drift_generate_with_another_checkpoint_exits_1_naming_both(
    tmp_path, tiny_dirs, swarms
):
    """`drift generate --model OTHER`: exit 1, one line naming the swarm's model and both
    fingerprints (not "no server covers")."""
    import os
    import sys

    served_dir = _named(tiny_dirs, "llama", tmp_path / "served", "acme-served")
    other_dir = save_tiny("llama", tmp_path / "mine" / "acme-mine", seed=1)
    config = json.loads((other_dir / "config.json").read_text())
    config["rms_norm_eps"] = 1e-3  # another checkpoint: its config differs
    (other_dir / "config.json").write_text(json.dumps(config))
    swarm = await swarms.start(served_dir, [(0, 4)])
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), DRIFT_CACHE=str(tmp_path / "c"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "drift.cli", "generate", "--initial_peers", swarm.token,
        "--model", str(other_dir), "--no_chat_template", "hi", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    lines = [ln for ln in err.decode().splitlines() if ln.startswith("drift generate:")]
    assert proc.returncode == 1 and len(lines) == 1, err.decode()
    mine = open_checkpoint(other_dir).fingerprint
    assert mine != swarm.fingerprint
    assert "'acme-served'" in lines[0] and mine[:16] in lines[0] and swarm.fingerprint in lines[0]
    assert "no server covers" not in lines[0]


async def test_when_only_another_model_is_left_routing_names_both(tmp_path, tiny_dirs, nodes,
                                                                  servers, sdk_models):  # fmt: skip
    """All servers of the client's model gone, another model served: the request fails with
    the mismatch (both named), not "no live server covers"; while its model is served with
    a block missing, it is "no live server covers"."""
    seed, _ = await nodes.start()
    token = seed.join_token()
    mine_dir = _named(tiny_dirs, "llama", tmp_path, "acme-mine")
    theirs_dir = save_tiny("qwen2", tmp_path / "acme-theirs")
    first = await servers(mine_dir, 0, 2, initial_peers=(token,))
    second = await servers(mine_dir, 2, 4, initial_peers=(token,))
    third = await servers(theirs_dir, 0, 4, initial_peers=(token,))
    want = {s.node.peer_id for s in (first, second, third)}
    for _ in range(200):  # until the seed lists all three
        if want <= {r.peer_id for r in seed.live_records() if r.state == "online"}:
            break
        await asyncio.sleep(0.05)
    model = await sdk_models.open(mine_dir, token.to_drift())
    ids = torch.tensor([[1, 2, 3]])
    await asyncio.to_thread(model, ids)
    await second.stop()
    with pytest.raises(MissingBlocks, match="no live server covers blocks 2-3"):
        await asyncio.to_thread(model, ids)
    await first.stop()
    for _ in range(100):  # until the client's own table drops its record (the TTL: 5 s)
        try:
            await asyncio.to_thread(model, ids)
        except MissingBlocks:
            await asyncio.sleep(0.1)
        except ModelMismatch as exc:
            info = exc
            break
    else:
        raise AssertionError("never a ModelMismatch")
    assert "'acme-mine'" in info.message and "'acme-theirs'" in info.message
