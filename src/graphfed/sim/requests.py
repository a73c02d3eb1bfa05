"""What the round loop asks of an executor: the loop is a generator of :class:`Train` and :class:`Evaluate`
requests, which :func:`drive` answers with one executor (a run alone) and a pack (:mod:`graphfed.sim.pack`) answers
for several runs in one batched call each."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from graphfed.client.executor import ClientExecutor, SubmittingExecutor

__all__ = ["Collect", "Evaluate", "Request", "Steps", "Submit", "Train", "drive", "serve"]


@dataclass(frozen=True)
class Train:
    """Train ``client_ids`` from ``start [S, dim]`` (:meth:`ClientExecutor.train`); answered with a TrainResult."""

    client_ids: torch.Tensor
    start: torch.Tensor
    round_index: int
    purpose: str
    steps: int | None = None
    broadcast: dict[str, torch.Tensor] | None = None


@dataclass(frozen=True)
class Evaluate:
    """Score ``client_ids`` given ``weights`` (:meth:`ClientExecutor.evaluate`); answered with each split's scores."""

    client_ids: torch.Tensor
    weights: torch.Tensor
    round_index: int


@dataclass(frozen=True)
class Submit:
    """Start training ``client_ids`` from ``start [S, dim]`` without waiting for them (an executor whose clients
    answer in their own time: Flower nodes under an asynchronous server); answered with None, the updates come
    through :class:`Collect`."""

    client_ids: torch.Tensor
    start: torch.Tensor
    round_index: int
    broadcast: dict[str, torch.Tensor] | None = None


@dataclass(frozen=True)
class Collect:
    """The submitted training that has ended since the last look (waits up to ``wait`` seconds for something to
    end); answered with :class:`graphfed.client.executor.Collected`."""

    wait: float


Request = Train | Evaluate | Submit | Collect
T = TypeVar("T")
Steps = Generator[Request, Any, T]


def serve(executor: ClientExecutor, request: Request) -> Any:
    if isinstance(request, Train):
        return executor.train(request.client_ids, request.start, request.round_index, request.purpose,
                              request.steps, request.broadcast)
    if isinstance(request, Submit | Collect):
        if not isinstance(executor, SubmittingExecutor):  # only an asynchronous server over such clients asks
            raise TypeError(f"{type(executor).__name__} trains when asked: it cannot {type(request).__name__.lower()}")
        if isinstance(request, Submit):
            return executor.submit(request.client_ids, request.start, request.round_index, request.broadcast)
        return executor.collect(request.wait)
    return executor.evaluate(request.client_ids, request.weights, request.round_index)


def drive(steps: Steps[T], executor: ClientExecutor) -> T:
    """Run ``steps`` to its end, answering each request with ``executor``; what the executor raises is raised where
    the request was made (a stopped run is the loop's to handle)."""
    try:
        request = next(steps)
        while True:
            try:
                answer = serve(executor, request)
            except BaseException as err:
                request = steps.throw(err)
            else:
                request = steps.send(answer)
    except StopIteration as done:
        return done.value
