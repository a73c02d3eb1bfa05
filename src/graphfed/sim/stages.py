"""The stages of a round around the clients' training and the server's step.

A round of :class:`graphfed.sim.engine.Simulator` is, in order:

1. **choose** the clients (:class:`Participation`: seeded sampling, late joiners, Poisson sampling under central DP);
2. **send**: the method personalises their weights (and any broadcast arrays); :class:`Traffic` counts the bytes;
3. **train**: the executor runs their local training (in this process, on Flower nodes, or packed with other runs);
4. **what arrives** (:class:`Arrivals`): uploads lost to ``train.dropout``, stragglers' uploads held for later rounds,
   and under central DP the one noised release that replaces the individual updates;
5. **server update**: the method learns from what arrived;
6. **observe**: evaluation and what follows it (:mod:`graphfed.sim.observe`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from graphfed.client.executor import TrainResult
from graphfed.client.privacy import (
    NoiseSource,
    PrivacyPlan,
    next_clip,
    noise_statement,
    noise_warning,
    noised_mean,
    poisson_sample,
)
from graphfed.config import ConfigError, RunConfig
from graphfed.core import rng
from graphfed.setup import Setup, build_setup

BYTES_PER_VALUE = 4  # float32 on the wire


class Participation:
    """Who takes part in each round: the late joiners and stragglers drawn once from the seed, then each round's
    cohort (a seeded draw of ``clients_per_round``, or Poisson coins from the privacy noise source)."""

    def __init__(self, config: RunConfig, setup: Setup, privacy: PrivacyPlan, noise: NoiseSource,
                 clients_per_round: int) -> None:
        self.config, self.privacy, self.noise = config, privacy, noise
        self.train_ids = setup.federation.train_client_ids
        self.clients_per_round = clients_per_round
        self.late_ids = self._draw(config.train.late_clients, "late_clients")
        self.straggler_ids = self._draw(round(config.train.stragglers * len(self.train_ids)), "stragglers")

    def _draw(self, count: int, purpose: str) -> torch.Tensor:
        """``count`` training clients drawn once from the seed (late joiners, stragglers)."""
        if purpose == "late_clients" and count >= len(self.train_ids):
            raise ConfigError(f"train.late_clients: {count} of {len(self.train_ids)} training clients would join "
                              f"late; at least one must train from round 1")
        order = torch.randperm(len(self.train_ids), generator=rng.generator(self.config.seed, 0, purpose),
                               device="cpu")
        return self.train_ids[order[:count]].sort().values

    def choose(self, round_index: int) -> torch.Tensor:
        """The clients of round ``round_index`` (0-based), in id order."""
        train_ids = self.train_ids
        if self.privacy.sampling_rate is not None:
            # central DP: Poisson sampling, the coins as secret as the noise (the sampling the accounting covers)
            return poisson_sample(train_ids, self.privacy, self.noise, round_index)
        per_round = self.clients_per_round
        if round_index + 1 < self.config.train.join_round:  # late clients are not there yet
            train_ids = train_ids[~torch.isin(train_ids, self.late_ids)]
            per_round = min(per_round, len(train_ids))
        order = torch.randperm(len(train_ids), generator=rng.generator(self.config.seed, round_index, "sampling"),
                               device="cpu")
        return train_ids[order[:per_round]].sort().values


class Traffic:
    """Values on the wire, counted where they cross it. Under central DP a round is counted for the expected
    cohort: its actual size is as private as the noise."""

    def __init__(self, setup: Setup, privacy: PrivacyPlan, clients_per_round: int) -> None:
        self.setup, self.central = setup, privacy.mechanism == "central"
        self.clients_per_round = clients_per_round
        self.communicates = type(setup.method).communicates

    def cohort(self, client_ids: torch.Tensor) -> int:
        return self.clients_per_round if self.central else len(client_ids)

    def wire_values(self, client_ids: torch.Tensor) -> int:
        if self.central:
            return self.clients_per_round * self.setup.spec.dim
        return self.setup.wire_values(client_ids)

    def down(self, client_ids: torch.Tensor, broadcast: dict[str, torch.Tensor]) -> int:
        """Bytes sent to ``client_ids``: their weights and their rows of ``broadcast``."""
        if not self.communicates:
            return 0
        extra = sum(value[:1].numel() for value in broadcast.values())
        return (self.wire_values(client_ids) + self.cohort(client_ids) * extra) * BYTES_PER_VALUE

    def up(self, result: TrainResult) -> int:
        """Bytes of what arrived: the updates (a rule may upload less than the model: FedRep its body) and any extra
        arrays (feedback, centroids)."""
        if not self.communicates:
            return 0
        rule, spec = self.setup.client_rule, self.setup.spec
        extras = [*rule.upload_shapes(), *(["feedback"] if "feedback" in result.metrics else [])]
        extra_up = sum(result.metrics[name][0].numel() for name in extras)
        if self.setup.family is None:
            extra_up += rule.upload_dim - spec.dim
        return (self.wire_values(result.client_ids) + self.cohort(result.client_ids) * extra_up) * BYTES_PER_VALUE


def subset(result: TrainResult, keep: torch.Tensor) -> TrainResult:
    """The uploads of ``result`` where the host mask ``keep`` is true."""
    return TrainResult(result.rows[keep], result.client_ids[keep], result.delta[keep.to(result.delta.device)],
                       {name: value[keep.to(value.device)] for name, value in result.metrics.items()})


class Arrivals:
    """What reaches the server of what the clients trained: uploads lost to ``train.dropout``, stragglers' uploads
    delivered rounds late, and under central DP the one noised release in place of the individual updates.

    ``in_flight`` (straggler uploads on their way: the round they arrive in, the weights the clients were sent, the
    result) is checkpointed; the loss and lateness counts live in the run's tracker."""

    def __init__(self, config: RunConfig, setup: Setup, straggler_ids: torch.Tensor) -> None:
        self.config, self.setup, self.straggler_ids = config, setup, straggler_ids
        self.in_flight: list[tuple[int, torch.Tensor, TrainResult]] = []

    def lose(self, result: TrainResult, round_index: int) -> tuple[TrainResult, list[int]]:
        """``train.dropout``: each upload is lost with that probability (one seeded stream per round), the way a
        Flower node's reply can fail to arrive. Returns what arrived and the clients whose uploads were lost."""
        draws = torch.rand(len(result.client_ids), generator=rng.generator(self.config.seed, round_index, "dropout"),
                           device="cpu")
        kept = draws >= self.config.train.dropout
        return subset(result, kept), result.client_ids[~kept.to(result.client_ids.device)].tolist()

    def stragglers(self, started: torch.Tensor, result: TrainResult,
                   round_index: int) -> tuple[torch.Tensor, TrainResult, list[int], int]:
        """``train.stragglers``: hold the stragglers' uploads of this round for ``straggler_delay`` rounds (lost
        at delay 0, or when the method cannot use a late upload); release those due now beside the fresh ones,
        each with the weights its client was sent back then. Returns (weights sent, what reaches the method this
        round, the clients whose uploads were lost, late uploads delivered)."""
        late = torch.isin(result.client_ids, self.straggler_ids)
        delay = self.config.train.straggler_delay
        lost: list[int] = []
        if late.any():
            if delay == 0 or not type(self.setup.method).accepts_late_uploads:
                lost = result.client_ids[late].tolist()
            else:
                self.in_flight.append((round_index + delay, started[late.to(started.device)], subset(result, late)))
        on_time = ~late
        arrived = [(started[on_time.to(started.device)], subset(result, on_time))]
        due = [(weights, held) for when, weights, held in self.in_flight if when == round_index]
        arrived += due
        self.in_flight = [entry for entry in self.in_flight if entry[0] != round_index]
        client_ids = torch.cat([held.client_ids for _, held in arrived])
        order = client_ids.argsort()  # methods see their clients in id order, as sampling gives them
        merged = TrainResult(torch.cat([held.rows for _, held in arrived])[order], client_ids[order],
                             torch.cat([held.delta for _, held in arrived])[order.to(result.delta.device)],
                             {name: torch.cat([held.metrics[name] for _, held in arrived])[order.to(value.device)]
                              for name, value in result.metrics.items()})
        weights = torch.cat([weights for weights, _ in arrived])[order.to(started.device)]
        return weights, merged, lost, sum(len(held.client_ids) for _, held in due)

    def state(self) -> list[dict[str, torch.Tensor | int | dict[str, torch.Tensor]]]:
        return [{"due": due, "sent": weights, "rows": held.rows, "client_ids": held.client_ids, "delta": held.delta,
                 "metrics": held.metrics} for due, weights, held in self.in_flight]

    def load(self, state: list[dict]) -> None:  # type: ignore[type-arg]
        self.in_flight = [(int(entry["due"]), entry["sent"], TrainResult(entry["rows"], entry["client_ids"],
                                                                         entry["delta"], dict(entry["metrics"])))
                          for entry in state]


def central_release(result: TrainResult, plan: PrivacyPlan, noise: NoiseSource, clip_norm: float | None,
                    expected_clients: float, round_index: int) -> tuple[torch.Tensor, float | None]:
    """``central``: the noised mean of the clipped updates (``[dim]``), DP-FedAvg's release, and the clip the next
    round uses under adaptive clipping (a released, noised count; None otherwise). No individual update, and not
    the cohort's size, reaches the method."""
    clip = plan.clip_norm if clip_norm is None else clip_norm
    released = noised_mean(result.delta, plan, expected_clients, noise, round_index, clip)
    if plan.adaptive_quantile is None:
        return released, None
    return released, next_clip(result.delta, clip, plan, expected_clients, noise, round_index)


class NoiseCheck:
    """The pre-flight of a private run whose server learns from the mean of the updates, from public quantities only
    (the plan, the model's size and initial weights, the planned cohort): before round 1 it states the noise on each
    release against the clip, and warns when even updates at the clip could not outweigh it. Its lines go to the log
    and to ``summary.json`` (``privacy.noise_check``).

    Under central DP the trusted server also measures the first cohort's median update norm against the noise
    (:meth:`measure`). That is a statistic of a secret cohort's raw updates, with no finite epsilon (one client in or
    out moves it), so it never reaches a shareable output: the engine writes it to ``private_diagnostics.json``,
    which the run lists outside the guarantee."""

    def __init__(self, plan: PrivacyPlan, init_weights: torch.Tensor, clients_per_round: int, rounds: int,
                 learns_from_mean: bool = True, all_take_part: bool = False) -> None:
        self.plan, self.dim, self.cohort, self.rounds = plan, init_weights.numel(), clients_per_round, rounds
        self.all_take_part = all_take_part
        self.weight_rms = float(init_weights.float().square().mean().sqrt())
        checked = plan.active and learns_from_mean  # a DP-SGD server's noise is on its own gradient, not a mean
        self.measured = plan.mechanism != "central" or not checked  # local: the server sees noised uploads only
        self.statement = noise_statement(plan, self.dim, clients_per_round) if checked else None
        self.warning = (noise_warning(plan, self.dim, clients_per_round, rounds, self.weight_rms,
                                      all_take_part=all_take_part) if checked else None)

    def measure(self, delta: torch.Tensor) -> dict[str, float | str | None] | None:
        """The first cohort's median update norm and the warning it gives (None where nothing was measured: not
        central, measured already, or an empty cohort): for ``private_diagnostics.json`` only."""
        if self.measured or not len(delta):
            return None
        self.measured = True
        typical = float(torch.linalg.vector_norm(delta.float(), dim=1).median())
        return {"median_update_norm": typical, "clip_norm": self.plan.clip_norm,
                "warning": noise_warning(self.plan, self.dim, self.cohort, self.rounds, self.weight_rms, typical,
                                         self.all_take_part)}

    def record(self) -> dict[str, str | None]:
        """What ``summary.json`` says (public quantities only)."""
        return {"statement": self.statement, "warning": self.warning}


def check_privacy(config: RunConfig, setup: Setup, privacy: PrivacyPlan) -> None:
    """``privacy:``: every upload the method's server reads is privatised, or the run stops here (one line)."""
    mechanism, method = privacy.mechanism, type(setup.method)
    if mechanism == "none":
        return
    prefix = f"privacy.mechanism={mechanism}: {method.name}"
    if not method.communicates:
        raise ConfigError(f"{prefix} releases nothing (each client trains alone; no update leaves it), so it needs no "
                          f"mechanism and its epsilon is 0: run it with privacy.mechanism=none (compare does so for "
                          f"it; in a suite, give its cell privacy: {{mechanism: none}})")
    if config.dataset.graph == "knn" and setup.method.reads_client_graph():
        raise ConfigError(f"{prefix} reads the client graph, and dataset.graph=knn builds it from each client's "
                          f"data (mean inputs, label shares) outside the mechanism; use the dataset's given "
                          f"graph or dataset.graph=none")
    if mechanism == "local":
        for rule in setup.clients.rules:
            uploads = [*rule.upload_shapes(), *(["feedback"] if rule.setting.training.feedback != "none" else [])]
            if uploads:
                raise ConfigError(f"{prefix} uploads {', '.join(uploads)} beside its update; only the update is "
                                  f"clipped and noised, so these would leave the client unprotected")
        return
    problem = setup.method.central_privacy_problem()
    if problem is not None:
        raise ConfigError(f"{prefix}: {problem}")
    if method.private_server_gradient and privacy.adaptive_quantile is not None:
        raise ConfigError(f"{prefix}: adaptive clipping follows the norms of updates; this method's central DP "
                          f"clips each client's gradient on the server's parameters: set privacy.clip_norm and "
                          f"leave privacy.adaptive_quantile unset")
    aggregation = getattr(setup.method.options, "aggregation", "fedavg")
    if aggregation != "fedavg":
        raise ConfigError(f"{prefix}: aggregation {aggregation} needs the individual updates; central DP releases "
                          f"only their noised sum")
    if config.train.late_clients or config.train.stragglers or config.train.dropout:
        raise ConfigError(f"{prefix}: the accounting assumes Poisson sampling of every training client each "
                          f"round; train.late_clients, train.stragglers and train.dropout change who takes part "
                          f"(and their counts would reveal the private sample)")


def privacy_refusal(config: RunConfig) -> str | None:
    """Why ``config``'s method cannot run under its ``privacy:`` (the line its run would stop with), or None."""
    if config.privacy.mechanism == "none":
        return None
    setup = build_setup(config)
    try:
        check_privacy(config, setup, setup.clients.privacy)
    except ConfigError as err:
        return str(err)
    return None


def check_privacy_first(rows: Iterable[tuple[str, RunConfig]]) -> None:
    """Each (label, config)'s privacy compatibility before any run starts (``compare``'s rows, ``bench``'s cells):
    one ConfigError naming every row that cannot run, so no run is spent on a comparison that cannot finish."""
    refusals = [f"{label}: {why}" for label, config in rows if (why := privacy_refusal(config)) is not None]
    if refusals:
        raise ConfigError("; ".join(refusals))


__all__ = ["BYTES_PER_VALUE", "Arrivals", "NoiseCheck", "Participation", "Traffic", "central_release",
           "check_privacy", "check_privacy_first", "privacy_refusal", "subset"]
