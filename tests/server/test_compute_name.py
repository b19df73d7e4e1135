"""`compute_name`: servers on the same cores (or GPU) announce the same name, others not."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from drift.server.compute_name import compute_name

CPU = torch.device("cpu")


@pytest.fixture
def boot(tmp_path):
    path = tmp_path / "boot_id"
    path.write_text("5b0c7d2e-0000-4000-8000-000000000001\n")
    return path


def _affinity(monkeypatch, cpus):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cpus), raising=False)


def test_servers_filling_the_same_cores_share_a_name(monkeypatch, boot, tmp_path) -> None:
    _affinity(monkeypatch, {0, 1})
    name = compute_name(CPU, threads=2, boot_id=boot)
    assert name is not None and len(name) == 16 and int(name, 16) >= 0
    assert compute_name(CPU, threads=2, boot_id=boot) == name
    assert compute_name(CPU, threads=8, boot_id=boot) == name  # the cores, not the threads
    other = tmp_path / "other_boot_id"
    other.write_text("5b0c7d2e-0000-4000-8000-000000000002\n")
    assert compute_name(CPU, threads=2, boot_id=other) not in (None, name)  # another host


def test_disjoint_cpusets_get_other_names(monkeypatch, boot) -> None:
    _affinity(monkeypatch, {0, 1})
    both = compute_name(CPU, threads=2, boot_id=boot)
    _affinity(monkeypatch, {0})
    first = compute_name(CPU, threads=1, boot_id=boot)
    _affinity(monkeypatch, {1})
    second = compute_name(CPU, threads=1, boot_id=boot)
    assert None not in (both, first, second) and len({both, first, second}) == 3


def test_a_server_leaving_room_beside_it_announces_none(monkeypatch, boot, tmp_path) -> None:
    _affinity(monkeypatch, {0, 1, 2, 3})
    assert compute_name(CPU, threads=2, boot_id=boot) is None  # half the cores: room for one more
    assert compute_name(CPU, threads=3, boot_id=boot) is not None
    assert compute_name(CPU, threads=4, boot_id=tmp_path / "missing") is None  # no boot id


def test_gpus_are_named_by_their_uuid(monkeypatch, boot) -> None:
    uuids = {0: "GPU-aaaa", 1: "GPU-bbbb"}
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(uuid=uuids[i]))  # fmt: skip
    first = compute_name(torch.device("cuda", 0), boot_id=boot)
    assert first == compute_name(torch.device("cuda", 0), boot_id=boot)
    assert first not in (None, compute_name(torch.device("cuda", 1), boot_id=boot))
    _affinity(monkeypatch, {0, 1})
    assert first != compute_name(CPU, threads=2, boot_id=boot)
