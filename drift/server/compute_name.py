"""The name of what a server computes on, announced so that clients know which servers share it.

Two servers that compute on the same cores (or the same GPU) slow each other down when they
run at once: a client that pipelines a long prompt's chunks along them (drift.client.chain:
server 2 computing chunk j while server 1 computes chunk j+1) only makes them compete, and
oversubscribed OpenMP pools lose more to waiting than the overlap gains. Sent one after the
other, each has the cores to itself.

The name is a digest of the kernel's boot id (one per running kernel: the same in every
container and network namespace of one host) and the CPUs this process may run on (its
affinity: servers in disjoint cpusets get different names), or the GPU's UUID. A CPU server
that uses at most half of its CPUs' threads leaves room for another beside it, and announces
no name (with one thread each, two servers on two cores do gain from overlapping). It says
nothing else about the machine. Where there is no boot id (not Linux), there is no name.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def compute_name(device: torch.device, threads: int | None = None,
                 boot_id: Path = BOOT_ID) -> str | None:  # fmt: skip
    """16 hex digits naming the cores (or GPU) blocks on `device` run on, or None where
    there is no boot id or a CPU server leaves room beside it (`threads`: its torch threads;
    default torch.get_num_threads())."""
    try:
        boot = boot_id.read_text().strip()
    except OSError:
        return None
    if not boot:
        return None
    if device.type == "cpu":
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        threads = torch.get_num_threads() if threads is None else threads
        if not cpus or 2 * threads <= len(cpus):
            return None
        what = "cpu:" + ",".join(map(str, cpus))
    elif device.type == "cuda":
        what = f"cuda:{_gpu_uuid(device)}"
    else:
        what = str(device)
    return hashlib.sha256(f"{boot}|{what}".encode()).hexdigest()[:16]


def _gpu_uuid(device: torch.device) -> str:
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        return str(torch.cuda.get_device_properties(index).uuid)
    except (AttributeError, RuntimeError):  # an older torch, or no such device
        return str(index)
