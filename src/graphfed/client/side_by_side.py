"""Clients side by side on a CPU: independent clients of a network that runs its clients one by one (BatchNorm
networks) train and score on worker threads, one intra-op thread each, instead of one client at a time.

Only when torch runs on one intra-op thread (``torch_threads: 1``): a client's kernels then run on one thread
wherever it runs, so its sums, and every number of the run, are those of the clients one after another. (With more
intra-op threads per worker the bits would hold too, but two workers' thread teams oversubscribe the cores, and on
2 cores that ran 0.5-1.2x the time of one client at a time, from one measurement to the next.) Small convolutions
split poorly over threads, so on 2 cores one client per core trains CNN-BN and ResNet-like clients faster than
one client on both cores (``benchmarks/cpu_grid.py --realistic``)."""

from __future__ import annotations

import functools
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

from graphfed.errors import ConfigError

#: environment variable that pins how many clients run side by side (1: one after another)
WORKERS_VARIABLE = "GRAPHFED_CLIENT_WORKERS"

Item = TypeVar("Item")
Result = TypeVar("Result")


def side_by_side_workers(device: torch.device) -> int:
    """How many clients computing on ``device`` run at once: 1 unless it is a CPU and torch runs on one intra-op
    thread, then ``GRAPHFED_CLIENT_WORKERS`` if set, else the cores this process may use."""
    if device.type != "cpu" or torch.get_num_threads() != 1:
        return 1
    pinned = os.environ.get(WORKERS_VARIABLE, "").strip()
    if pinned:
        if not pinned.isdigit() or int(pinned) < 1:
            raise ConfigError(f"{WORKERS_VARIABLE}={pinned!r}: give a whole number of clients, at least 1")
        return int(pinned)
    return usable_cores()


def map_side_by_side(work: Callable[[Item], Result], items: Iterable[Item], workers: int) -> Iterator[Result]:
    """``work`` of each item, in the items' order, ``workers`` at a time (at most that many items read ahead, so a
    lazy ``items`` holds a few clients' rows, not all of them); one after another on this thread when ``workers``
    is 1."""
    if workers <= 1:
        yield from map(work, items)
        return
    pool = _worker_pool(workers)
    threads = torch.get_num_threads()

    def on_the_runs_threads(item: Item) -> Result:
        # a worker keeps the thread count it first ran with (a run before may have had more); this run's decides
        # how its sums split
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return work(item)

    pending: deque[Future[Result]] = deque()
    for item in items:
        pending.append(pool.submit(on_the_runs_threads, item))
        if len(pending) >= workers:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def on_one_thread(work: Callable[[], Result]) -> Result:
    """``work()`` with torch on one intra-op thread (as a ``torch_threads: 1`` run), then the count it had."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return work()
    finally:
        torch.set_num_threads(threads)


@functools.cache
def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system says, else every core)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


@functools.cache
def _worker_pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="graphfed-client")


__all__ = ["WORKERS_VARIABLE", "map_side_by_side", "side_by_side_workers", "usable_cores"]
