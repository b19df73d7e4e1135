"""The client-parts manifest (drift.wire.parts): it round-trips, and every malformed field is
refused with a message naming it (a manifest comes from the network)."""

from __future__ import annotations

import copy

import pytest

from drift.wire.errors import BadRequest
from drift.wire.parts import PartFile, PartsManifest, is_fingerprint, parts_path

FP = "ab" * 32
GOOD = PartsManifest("acme", FP, None, (PartFile("config.json", "0" * 64, 10),
                                        PartFile("model.safetensors", "1" * 64, 99)))  # fmt: skip


def test_round_trip_and_paths():
    assert PartsManifest.from_wire(GOOD.to_wire()) == GOOD
    assert GOOD.total_bytes == 109
    assert parts_path(FP) == f"/parts/{FP}" and parts_path(FP, "1" * 64).endswith("/" + "1" * 64)
    assert is_fingerprint(FP) and not is_fingerprint(FP[:-1]) and not is_fingerprint(FP.upper())


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d.update(version=2), "version"),
        (lambda d: d.update(model=""), "'model'"),
        (lambda d: d.update(fingerprint="xyz"), "'fingerprint'"),
        (lambda d: d.update(revision=3), "'revision'"),
        (lambda d: d.update(files=[]), "'files'"),
        (lambda d: d["files"].append(dict(d["files"][0])), "twice"),
        (lambda d: d["files"].pop(), "no model.safetensors"),
        (lambda d: d["files"][0].update(name="../etc/passwd"), "plain file name"),
        (lambda d: d["files"][0].update(name=".hidden"), "plain file name"),
        (lambda d: d["files"][0].update(sha256="G" * 64), "sha256"),
        (lambda d: d["files"][0].update(size=-1), "size"),
        (lambda d: d["files"][0].update(size=True), "size"),
        (lambda d: d["files"][0].update(extra=1), "name, sha256 and size"),
    ],
)
def test_malformed_manifests_are_refused(change, words):
    data = copy.deepcopy(GOOD.to_wire())
    change(data)
    with pytest.raises(BadRequest, match=words):
        PartsManifest.from_wire(data)
    with pytest.raises(BadRequest, match="JSON object"):
        PartsManifest.from_wire([1])
