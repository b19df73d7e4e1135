"""drift.models.threads.threads: the calling thread's torch thread count set for a while and
restored on that thread, whatever other threads hold meanwhile."""

from __future__ import annotations

import threading

import torch

from drift.models.threads import threads


def test_each_thread_sets_and_restores_its_own_count() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threads(None):
            assert torch.get_num_threads() == 2
        inside, leave = threading.Event(), threading.Event()
        seen: list[int] = []

        def other() -> None:
            with threads(1):
                inside.set()
                leave.wait(10)
                seen.append(torch.get_num_threads())
            seen.append(torch.get_num_threads())

        holder = threading.Thread(target=other)
        holder.start()
        assert inside.wait(10)
        with threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2  # this thread's count, back
        leave.set()
        holder.join(10)
        assert seen[0] == 1  # the other thread's, untouched by this one leaving first
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
