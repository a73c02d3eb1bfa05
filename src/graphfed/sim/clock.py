"""The simulated clock: how long each client's local training takes and when a client is online.

Each client has a speed (lognormal, seeded: ``train.clock.speed_spread`` is the ratio of its 95th to its 5th
percentile) and an on/off cycle (online ``availability`` of every ``period_seconds``, from a seeded phase). A
dispatch's work is ``train.local_steps * step_seconds / speed`` seconds of online time: an offline client pauses and
resumes when it is back. A synchronous round lasts until its slowest client is done, plus ``server_seconds``; the
asynchronous server (:mod:`graphfed.sim.asynchronous`) orders arrivals by the same clock. The clock only measures:
it draws from streams of its own, so a synchronous run's numbers are the same with it as without.
"""

from __future__ import annotations

import math

import torch

from graphfed.config import ClockConfig
from graphfed.core import rng

#: the standard normal's 95th percentile: a lognormal of sigma s spreads exp(2 * 1.645 * s) from 5th to 95th
_Z95 = 1.6448536269514722


class SimulatedClock:
    """Client speeds and availability of one run (from its seed), and the finish times they give."""

    def __init__(self, config: ClockConfig, num_clients: int, local_steps: int, seed: int) -> None:
        self.config = config
        sigma = math.log(config.speed_spread) / (2 * _Z95)
        normal = torch.randn(num_clients, generator=rng.generator(seed, 0, "clock_speeds"), dtype=torch.float64)
        #: [N] each client's speed (1: a step takes step_seconds)
        self.speeds = torch.exp(sigma * normal)
        #: [N] where in its on/off cycle each client is at time 0
        self.phases = torch.rand(num_clients, generator=rng.generator(seed, 0, "clock_phases"),
                                 dtype=torch.float64) * config.period_seconds
        self.local_steps = local_steps

    def work_seconds(self, client: int) -> float:
        """Online seconds one dispatch of ``client`` takes."""
        return self.local_steps * self.config.step_seconds / float(self.speeds[client])

    def _window(self, client: int, at: float) -> tuple[int, float]:
        """The on/off cycle ``at`` falls in (its index) and when that cycle's on-window opens."""
        period, phase = self.config.period_seconds, float(self.phases[client])
        cycle = math.floor((at + phase) / period)
        return cycle, cycle * period - phase

    def online(self, client: int, at: float) -> bool:
        if self.config.availability >= 1.0:
            return True
        _, opens = self._window(client, at)
        return at < opens + self.config.availability * self.config.period_seconds

    def next_online(self, client: int, at: float) -> float:
        """The first time from ``at`` on that ``client`` is online."""
        if self.online(client, at):
            return at
        cycle, _ = self._window(client, at)
        return (cycle + 1) * self.config.period_seconds - float(self.phases[client])

    def finish(self, client: int, start: float) -> float:
        """When a dispatch of ``client`` that starts at ``start`` is done: its work in online time, paused while the
        client is offline. Walks the cycles by their index (a time summed window by window could stall below a
        float's resolution at a window's edge)."""
        remaining = self.work_seconds(client)
        if self.config.availability >= 1.0:
            return start + remaining
        period, on = self.config.period_seconds, self.config.availability * self.config.period_seconds
        cycle, _ = self._window(client, start)
        now = start
        while True:
            opens = cycle * period - float(self.phases[client])
            now = max(now, opens)
            if now < opens + on:
                if remaining <= opens + on - now:
                    return now + remaining
                remaining -= opens + on - now
            cycle += 1

    def round_end(self, client_ids: torch.Tensor, start: float) -> float:
        """When a synchronous round that starts at ``start`` with ``client_ids`` has its last update and its server
        step (a round without clients takes the server step alone)."""
        finishes = [self.finish(int(client), start) for client in client_ids.tolist()]
        return max(finishes, default=start) + self.config.server_seconds


__all__ = ["SimulatedClock"]
