"""Client-level differential privacy: clipping, Gaussian noise and its accounting (``privacy:`` in the config).

The unit protected is a whole client. Which neighbouring federations a guarantee is for (``privacy.neighbours``):

* ``local`` (each client clips its update to ``clip_norm`` (L2) and adds ``N(0, (noise_multiplier * clip_norm)^2)``
  to every coordinate before it leaves; on Flower, on the SuperNode: the server never holds a raw update). Each
  round a client takes part in is one Gaussian mechanism; a client's epsilon composes the rounds it took part in (no
  amplification: the server sees each upload). ``zero_out`` (the default) compares a client's upload with the
  upload of the same client holding no data (a zero update, noised alike): sensitivity ``clip_norm``.
  ``replace_one`` compares any two uploads: sensitivity ``2 * clip_norm``, so the same noise spends more (the
  accountant is given half the multiplier) and a target epsilon calibrates twice the noise.
* ``central`` (``add_remove``, a trusted server): the server clips each client's update, sums them, adds the noise
  once to the sum and divides by the expected cohort size (DP-FedAvg, McMahan et al., ICLR 2018, "Learning
  differentially private recurrent language models"). Clients are sampled Poisson (each with probability q =
  clients_per_round / training clients, independently, every round) so that the accounting's subsampling
  amplification is the sampling the engine does; epsilon composes every round the server released a noised sum,
  an empty cohort's included (its release is the noise alone). With ``adaptive_quantile`` the clip follows a
  quantile of the update norms (Andrew et al., NeurIPS 2021, "Differentially private learning with adaptive
  clipping"): each round the server also releases the noised count of clients whose update was within the clip
  (each client's bit shifted to +-1/2, noise std ``quantile_noise``) and moves the clip geometrically towards the
  quantile. Both releases are Gaussian queries of the same clients, so together they are one Gaussian mechanism of
  noise multiplier ``(z_sum^-2 + (2 quantile_noise)^-2)^(-1/2)`` (their Theorem 1): the accounted
  ``noise_multiplier`` is that total, and the sum's own noise ``z_sum`` is set to meet it.

**Where the randomness comes from.** Noise and the Poisson sampling coins come from the operating system's
cryptographically secure generator (:class:`SecureNoise`, ``os.urandom``: the anchor is Opacus's ``secure_mode``),
never from the run's seed, and no output or message carries anything that determines them: a reader of
``config.yaml``, ``summary.json`` or the Flower messages cannot regenerate them, and a resumed run or a re-sent round
draws new noise. Each Gaussian value is the sum of four draws halved (variance unchanged), as Opacus does against
floating-point attacks on the sampler. ``privacy.reproducible_noise: true`` draws them from (seed, round, purpose)
streams instead (:class:`SeededNoise`), for simulation research only: the run's numbers repeat, and anyone who reads
its seed removes the noise, so such a run protects nothing and says so in every output; Flower refuses it.

The accounting is Google's ``dp-accounting`` library (``pld``: privacy loss distributions, tight; ``rdp``: Renyi
DP, an upper bound): nothing here computes an epsilon itself. ``target_epsilon`` is turned into a noise multiplier
by the library's own calibration for the run's planned rounds (local: the worst case, a client in every round).
"""

from __future__ import annotations

import json
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar

import numpy as np
import torch

from graphfed.config import ConfigError, PrivacyConfig
from graphfed.core import rng

#: the calibration's tolerance on the noise multiplier (its epsilon then lies well within 1 % of the target)
CALIBRATION_TOLERANCE = 1e-5
#: an epsilon this far (relative) above the target is above it: the calibration meets the target from below, and the
#: accountants agree with themselves far closer than this
TARGET_TOLERANCE = 1e-6
#: what each neighbouring relation compares, in the words the summary and the docs use
NEIGHBOURS = {
    "zero_out": "zero-out: a client's upload against the same client holding no data (sensitivity clip_norm)",
    "replace_one": "replace-one: any two uploads of a client (sensitivity 2 x clip_norm)",
    "add_remove": "add/remove: the federation with and without one client, every round (sensitivity clip_norm)",
}
REPRODUCIBLE_WARNING = ("privacy.reproducible_noise: the noise and the sampling are drawn from the run's seed, which "
                        "config.yaml and summary.json record: anyone who reads it removes the noise, so this run "
                        "protects nobody (for simulation research only)")
SECURE_NOTE = ("noise and Poisson coins from the operating system's secure generator (os.urandom): never written, "
               "logged or sent, so no output of the run regenerates them")


# ---- where the randomness comes from ---------------------------------------------------------------------------
class NoiseSource(ABC):
    """Gaussian noise and uniform coins for the mechanisms. ``round_index``, ``purpose`` and ``key`` name the draw
    (a seeded source derives its stream from them; the secure one ignores them)."""

    reproducible: ClassVar[bool]

    @abstractmethod
    def gaussian(self, shape: tuple[int, ...], std: float, device: torch.device | str, round_index: int,
                 purpose: str, key: int | None = None) -> torch.Tensor:
        """``N(0, std^2)`` per value, float32 on ``device``."""

    @abstractmethod
    def uniform(self, count: int, round_index: int, purpose: str) -> torch.Tensor:
        """``count`` coins uniform on [0, 1), on the host."""

    def gaussian_rows(self, rows: int, dim: int, std: float, device: torch.device | str, round_index: int,
                      purpose: str, client_ids: torch.Tensor) -> torch.Tensor:
        """``[rows, dim]`` noise, one row per client of ``client_ids`` (a seeded source: one stream per client)."""
        return self.gaussian((rows, dim), std, device, round_index, purpose)


class SecureNoise(NoiseSource):
    """The operating system's CSPRNG (``os.urandom``): 53-bit uniforms, Box-Muller in float64; each Gaussian value
    the sum of four draws halved, as Opacus's ``secure_mode`` does against floating-point attacks on the sampler."""

    reproducible = False

    @staticmethod
    def _uniforms(count: int) -> np.ndarray:
        """``count`` float64 values in (0, 1), 53 random bits each."""
        bits = np.frombuffer(os.urandom(8 * count), dtype=np.uint64) >> np.uint64(11)
        return (bits.astype(np.float64) + 0.5) * 2.0 ** -53

    def _normals(self, count: int) -> np.ndarray:
        pairs = (count + 1) // 2
        radius = np.sqrt(-2.0 * np.log(self._uniforms(pairs)))
        angle = 2.0 * np.pi * self._uniforms(pairs)
        return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]

    def gaussian(self, shape: tuple[int, ...], std: float, device: torch.device | str, round_index: int,
                 purpose: str, key: int | None = None) -> torch.Tensor:
        count = math.prod(shape)
        draws = sum(self._normals(count) for _ in range(4)) / 2.0
        return torch.from_numpy(draws * std).reshape(shape).to(device=device, dtype=torch.float32)

    def uniform(self, count: int, round_index: int, purpose: str) -> torch.Tensor:
        return torch.from_numpy(self._uniforms(count))


@dataclass(frozen=True)
class SeededNoise(NoiseSource):
    """``privacy.reproducible_noise``: every draw from a (seed, round, purpose[, key]) stream, drawn on the host (the
    same numbers on every device). Reproducible, hence protects nothing against anyone who knows the seed."""

    seed: int
    reproducible: ClassVar[bool] = True

    def gaussian(self, shape: tuple[int, ...], std: float, device: torch.device | str, round_index: int,
                 purpose: str, key: int | None = None) -> torch.Tensor:
        generator = torch.Generator(device="cpu").manual_seed(rng.stream_seed(self.seed, round_index, purpose, key))
        return (torch.randn(shape, generator=generator, device="cpu") * std).to(device)

    def uniform(self, count: int, round_index: int, purpose: str) -> torch.Tensor:
        return torch.rand(count, generator=rng.generator(self.seed, round_index, purpose), device="cpu").double()

    def gaussian_rows(self, rows: int, dim: int, std: float, device: torch.device | str, round_index: int,
                      purpose: str, client_ids: torch.Tensor) -> torch.Tensor:
        # one stream per client, so a client adds the same noise whether it trains alone or in a batch
        return torch.stack([self.gaussian((dim,), std, device, round_index, purpose, int(client))
                            for client in client_ids]) if rows else torch.zeros(0, dim, device=device)


@dataclass(frozen=True)
class PrivacyPlan:
    """A run's mechanism, resolved from its config: the noise multiplier (calibrated when a target epsilon was
    given), delta (default 0.1 / training clients), the neighbouring relation, where the noise comes from, and for
    ``central`` the Poisson sampling rate."""

    mechanism: str
    clip_norm: float
    noise_multiplier: float
    delta: float
    accountant: str
    rounds: int
    sampling_rate: float | None  #: central: each training client's probability of joining a round
    #: adaptive clipping (central): the target quantile, the clip's geometric step, the count's noise std (clients)
    adaptive_quantile: float | None = None
    clip_learning_rate: float = 0.2
    quantile_noise: float | None = None
    neighbours: str = "zero_out"
    reproducible: bool = False  #: noise and coins from the seed (``privacy.reproducible_noise``): protects nothing
    model_selection: str = "last"
    training_clients: int | None = None  #: what the default delta is stated against
    #: local: the most noised uploads any client makes (a training client's rounds, a novel client's adaptation)
    novel_rounds: int = 0
    calibrated: bool = False  #: the noise was calibrated to ``privacy.target_epsilon``
    target_epsilon: float | None = None  #: ``privacy.target_epsilon``: what every client's epsilon must stay within

    def above_target(self, spent: dict[str, float]) -> dict[str, float]:
        """The entries of ``spent`` (epsilon by client, or the run's) above :attr:`target_epsilon`, beyond the
        calibration's rounding; empty without a target."""
        if self.target_epsilon is None:
            return {}
        return {name: value for name, value in spent.items()
                if value > self.target_epsilon * (1 + TARGET_TOLERANCE)}

    @property
    def releases_per_client(self) -> int:
        """The most releases the guarantee must cover for one client: rounds released (central), or the most
        noised uploads any client makes (local: ``train.rounds`` for a training client, ``train.novel_adapt_rounds``
        for a novel one)."""
        return max(self.rounds, self.novel_rounds) if self.mechanism == "local" else self.rounds

    @property
    def sensitivity(self) -> float:
        """How many clip norms one client's change moves a release by (2 for replace-one neighbours)."""
        return 2.0 if self.neighbours == "replace_one" else 1.0

    @property
    def accounted_multiplier(self) -> float:
        """The noise multiplier the accountant is given: the noise's std over the sensitivity."""
        return self.noise_multiplier / self.sensitivity

    @property
    def sum_noise_multiplier(self) -> float:
        """The noise multiplier of the sum itself: the accounted one, less what the count of clients under an
        adaptive clip spends (Andrew et al., Theorem 1)."""
        if self.quantile_noise is None or self.noise_multiplier == 0:
            return self.noise_multiplier
        rest = self.noise_multiplier ** -2 - (2 * self.quantile_noise) ** -2
        if rest <= 0:
            raise ConfigError(f"privacy.quantile_noise: {self.quantile_noise:g} leaves no budget for the sum at noise "
                              f"multiplier {self.noise_multiplier:.4g}; raise it (or the noise)")
        return float(rest ** -0.5)

    @property
    def active(self) -> bool:
        return self.mechanism != "none"

    def noise_source(self, seed: int) -> NoiseSource:
        """Where this run's noise and coins come from: the secure generator unless reproducible noise was asked."""
        return SeededNoise(seed) if self.reproducible else SecureNoise()

    def epsilon_of_rounds(self, rounds: int) -> float:
        """The (client-level) epsilon at ``self.delta`` after ``rounds`` mechanisms: ``rounds`` a client took part
        in (local), or rounds released (central)."""
        return epsilon(self.accountant, self.accounted_multiplier, rounds, self.sampling_rate, self.delta)

    def releases_note(self) -> str:
        """How many releases of one client the noise was sized for, and why that many."""
        if self.mechanism == "central":
            return f"{self.rounds} rounds released (train.rounds), each a Poisson-sampled noised sum"
        novel = (f", a novel client's adaptation {self.novel_rounds} (train.novel_adapt_rounds)" if self.novel_rounds
                 else "")
        return (f"{self.releases_per_client} noised uploads per client, the most any client makes (a training "
                f"client's at most {self.rounds} (train.rounds){novel})")

    def record(self) -> dict[str, Any]:
        delta_note = (f"0.1 / {self.training_clients} training clients (the default: below 1 / clients)"
                      if self.training_clients else "given")
        return {"mechanism": self.mechanism, "clip_norm": self.clip_norm, "noise_multiplier": self.noise_multiplier,
                "releases_per_client": self.releases_per_client,
                ("calibrated_for" if self.calibrated else "sized_for"): self.releases_note(),
                **({"target_epsilon": self.target_epsilon} if self.target_epsilon is not None else {}),
                "delta": self.delta, "delta_source": delta_note, "accountant": self.accountant,
                "neighbours": self.neighbours, "neighbours_meaning": NEIGHBOURS[self.neighbours],
                "noise": REPRODUCIBLE_WARNING if self.reproducible else SECURE_NOTE,
                "reproducible_noise": self.reproducible,
                "model_selection": self.model_selection,
                "outside_the_guarantee": self.outside_the_guarantee(),
                "sampling": (f"poisson, q = {self.sampling_rate:.6g} per client and round" if self.sampling_rate
                             else "none: every upload is noised where it is made"),
                **({"adaptive_quantile": self.adaptive_quantile, "clip_learning_rate": self.clip_learning_rate,
                    "quantile_noise": self.quantile_noise, "sum_noise_multiplier": self.sum_noise_multiplier}
                   if self.adaptive_quantile is not None else {})}

    def outside_the_guarantee(self) -> list[str]:
        """What the run outputs that its epsilon does not cover, in words."""
        outside = ["the evaluation scores (each client's val/test metrics in rounds.jsonl, summary.json and the "
                   "tables): measurements for the researcher, computed on the clients' own rows"]
        if self.model_selection == "validation":
            outside.append("which round's models are reported and saved, and any early stop: chosen by the clients' "
                           "validation scores (privacy.model_selection=validation)")
        if self.reproducible:
            outside.append("everything: the noise is reproducible from the seed (privacy.reproducible_noise)")
        if self.active:
            central = self.mechanism == "central"
            cohorts = " (under central DP, the union of the secret Poisson cohorts)" if central else ""
            outside.append(f"checkpoint.pt: the simulator plays every party, so its checkpoint also holds the clients' "
                           f"side: which clients ever trained{cohorts} and each client's own state (a personal model, "
                           f"a head, control variates); in a deployment these stay with the clients: do not publish "
                           f"it")
            outside.append("models/best.pt: every client's model as it evaluates it, which beyond the server's "
                           "released model holds what clients computed from their own rows (personal models, "
                           "fine-tuning): do not publish it")
        if self.mechanism == "central":
            outside.append("on Flower, dropped_clients, missed_rounds and drop_counts (summary.json, rounds.jsonl, "
                           "the ServerApp's log): they name clients of the secret cohorts whose nodes did not reply")
            outside.append("private_diagnostics.json: the noise check's measurement of the first cohort's median "
                           "raw update norm against the noise (a statistic of a secret cohort's raw updates, for the "
                           "researcher alone): do not publish it")
        return outside


def plan_privacy(config: PrivacyConfig, num_train_clients: int, clients_per_round: int, rounds: int,
                 novel_rounds: int = 0) -> PrivacyPlan:
    """Resolve ``config`` for a federation of ``num_train_clients`` training clients (the same on the server and
    on every node: calibration is deterministic). ``novel_rounds``: the noised uploads each novel client makes
    while it adapts (local DP; 0 when none adapt). A ``target_epsilon`` is met by every client: the noise is
    calibrated for the most releases any client makes."""
    delta = config.delta if config.delta is not None else 0.1 / num_train_clients
    rate = min(1.0, clients_per_round / num_train_clients) if config.mechanism == "central" else None
    neighbours = config.neighbours or ("add_remove" if config.mechanism == "central" else "zero_out")
    sensitivity = 2.0 if neighbours == "replace_one" else 1.0
    novel_rounds = novel_rounds if config.mechanism == "local" else 0
    noise = config.noise_multiplier
    calibrated = config.mechanism != "none" and noise is None
    if calibrated:
        assert config.target_epsilon is not None  # the config's validator asks for one of the two
        noise = sensitivity * calibrate_noise(config.accountant, config.target_epsilon, max(rounds, novel_rounds),
                                              rate, delta)
    adaptive = config.adaptive_quantile
    quantile_noise = None
    if adaptive is not None:
        # Andrew et al. take expected clients / 20; a small cohort would then spend most of the budget on the
        # count, so the default also lets the count spend at most a tenth of it ((2 s)^-2 <= z^-2 / 10)
        quantile_noise = config.quantile_noise or max(min(clients_per_round, num_train_clients) / 20,
                                                      math.sqrt(10) * float(noise or 0.0) / 2)
    plan = PrivacyPlan(config.mechanism, config.clip_norm, float(noise or 0.0), delta, config.accountant, rounds,
                       rate, adaptive, config.clip_learning_rate, quantile_noise, neighbours,
                       config.reproducible_noise, config.model_selection,
                       num_train_clients if config.delta is None else None, novel_rounds, calibrated,
                       config.target_epsilon if config.mechanism != "none" else None)
    plan.sum_noise_multiplier  # noqa: B018 - a count noise that leaves the sum no budget is an error now
    return plan


def noise_levers(all_take_part: bool = False) -> str:
    """What lowers the noise against what the clients send, for a line that says the noise is too large; more
    clients per round only where some clients sit a round out (``all_take_part``: every training client already
    takes part in every round)."""
    cohort = [] if all_take_part else ["more clients per round (train.clients_per_round: the noise is divided by "
                                       "the expected cohort)"]
    levers = [*cohort, "a larger privacy.target_epsilon", "fewer train.rounds", "a smaller privacy.clip_norm (the "
              "noise scales with it; near the clients' typical update norm) or train.lr"]
    return ", ".join(levers) + ", or adaptive clipping (privacy.adaptive_quantile)"


#: :func:`noise_levers` where the cohort is not known (a non-finite update's message)
NOISE_LEVERS = noise_levers()


def release_noise(plan: PrivacyPlan, dim: int, clients_per_round: int) -> float:
    """The norm of the noise on the mean of the clients' updates the server learns from, per round: central, the
    sum's noise over the expected cohort; local, the uploads' independent noises averaged over the cohort."""
    if plan.mechanism == "central":
        return plan.sum_noise_multiplier * plan.clip_norm * math.sqrt(dim) / clients_per_round
    return plan.noise_multiplier * plan.clip_norm * math.sqrt(dim / clients_per_round)


def noise_statement(plan: PrivacyPlan, dim: int, clients_per_round: int) -> str:
    """Before round 1: how large the noise on each round's released mean is, against the clip norm."""
    norm = release_noise(plan, dim, clients_per_round)
    cohort = "an expected cohort" if plan.mechanism == "central" else "a cohort"
    return (f"{plan.mechanism} DP: the noise on each round's mean update has norm {norm:.3g} "
            f"({norm / plan.clip_norm:.3g} x the clip norm {plan.clip_norm:g}; std {norm / math.sqrt(dim):.3g} per "
            f"weight over {dim:,} weights, {cohort} of {clients_per_round:g} clients, noise multiplier "
            f"{plan.noise_multiplier:.3g})")


def noise_warning(plan: PrivacyPlan, dim: int, clients_per_round: int, rounds: int, weight_rms: float,
                  typical_norm: float | None = None, all_take_part: bool = False) -> str | None:
    """One line when the noise may be too large for the model to learn, or None. Either the noise alone moves each
    weight, over ``rounds`` rounds (as sqrt(rounds)), by more than the weights' own size at the start
    (``weight_rms``: the model is then mostly noise), or the noise on the means outweighs the most the updates can
    add up to (rounds x their typical norm, at most the clip; ``typical_norm``: a measured median, else the clip).
    A pre-flight, not a verdict: the run's scores against the trivial predictors say whether the model learned."""
    norm = release_noise(plan, dim, clients_per_round)
    drift = norm / math.sqrt(dim) * math.sqrt(rounds)
    signal = plan.clip_norm if typical_norm is None else min(typical_norm, plan.clip_norm)
    if drift > weight_rms:
        reason = (f"over {rounds} rounds it moves each weight by {drift:.3g} (std), {drift / weight_rms:.3g} x the "
                  f"weights' own size at the start ({weight_rms:.3g})")
    elif norm * math.sqrt(rounds) > rounds * signal:
        measured = ("the clients' median norm in round 1" if typical_norm is not None
                    else "the clip norm: the largest a clipped update can be")
        reason = (f"over {rounds} rounds the noise on the released means adds up to norm "
                  f"{norm * math.sqrt(rounds):.3g}, more than updates of norm {signal:.3g} ({measured}) can add "
                  f"up to ({rounds * signal:.3g})")
    else:
        return None
    return (f"the noise may be too large for the model to learn: {reason}; if the model does not beat its trivial "
            f"predictor, lower it with {noise_levers(all_take_part)}")


# ---- the mechanisms --------------------------------------------------------------------------------------------
def clip_rows(delta: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Each row scaled to L2 norm at most ``clip_norm`` (rows already within it are left exactly as they are)."""
    if math.isinf(clip_norm):
        return delta
    norms = torch.linalg.vector_norm(delta, dim=1, keepdim=True)
    return delta * torch.clamp(clip_norm / norms.clamp_min(torch.finfo(delta.dtype).tiny), max=1.0)


def poisson_sample(train_ids: torch.Tensor, plan: PrivacyPlan, noise: NoiseSource, round_index: int) -> torch.Tensor:
    """``central``: each training client joins the round alone with probability q (the sampling the accounting's
    amplification assumes); the coins come from ``noise``'s source, so the cohort is as secret as the noise."""
    assert plan.sampling_rate is not None
    coins = noise.uniform(len(train_ids), round_index, "sampling")
    return train_ids[coins < plan.sampling_rate]


def privatize_uploads(delta: torch.Tensor, plan: PrivacyPlan, noise: NoiseSource, round_index: int,
                      client_ids: torch.Tensor, purpose: str = "privacy") -> torch.Tensor:
    """``local``: each client's update clipped and noised where it is made."""
    clipped = clip_rows(delta, plan.clip_norm)
    if plan.noise_multiplier == 0:
        return clipped
    std = plan.noise_multiplier * plan.clip_norm
    rows = noise.gaussian_rows(len(delta), delta.shape[1], std, delta.device, round_index, purpose, client_ids)
    return clipped + rows.to(delta.dtype)


def noised_mean(delta: torch.Tensor, plan: PrivacyPlan, expected_clients: float, noise: NoiseSource,
                round_index: int, clip_norm: float | None = None) -> torch.Tensor:
    """``central``: ``(sum of the clipped updates + N(0, (z_sum * clip)^2 I)) / expected_clients`` (``[dim]``;
    ``clip_norm``: this round's adaptive clip, default the plan's). No rows (an empty Poisson cohort) releases the
    noise alone. Dividing by the expected cohort, not the actual one, keeps the cohort's size private too."""
    clip = plan.clip_norm if clip_norm is None else clip_norm
    total = clip_rows(delta, clip).sum(0)
    if plan.noise_multiplier > 0:
        std = plan.sum_noise_multiplier * clip
        total = total + noise.gaussian((delta.shape[1],), std, delta.device, round_index, "privacy").to(delta.dtype)
    return total / expected_clients


@dataclass
class ServerGradientPrivacy:
    """``central`` for a server that learns each client's model from that client's update (pFedHN, Panacea): DP-SGD
    on the server's parameters with clients as the examples (Abadi et al., CCS 2016, with clients in place of
    examples as in McMahan et al., ICLR 2018). Each client's contribution to the gradient of every server parameter
    is clipped to ``clip_norm``; the clipped contributions are summed; Gaussian noise of std ``z * clip * sqrt(k)``
    is added to the sum at each of a round's ``k`` server steps (``k`` Gaussian steps on one Poisson sample compose to
    one Gaussian of multiplier ``z``, the one accounted); the sum is divided by the expected cohort. Every server
    parameter is updated only so, hence every model the server computes (each client's, any novel client's start)
    is differentially private with respect to any one client's participation, towards everyone but the trusted
    server, which still reads the raw updates. A round with no client still steps on the noise alone."""

    plan: PrivacyPlan
    expected_clients: float
    noise: NoiseSource
    steps_per_round: int = 1
    round_index: int = 0
    steps_taken: int = 0

    def begin_round(self, round_index: int) -> None:
        self.round_index, self.steps_taken = round_index, 0

    def noise_std(self) -> float:
        return self.plan.noise_multiplier * self.plan.clip_norm * math.sqrt(self.steps_per_round)

    def step(self, optimizer: torch.optim.Optimizer, sent: torch.Tensor, direction: torch.Tensor,
             extra_loss: torch.Tensor | None = None) -> None:
        """The private form of :func:`graphfed.core.hypergrad.hypergradient_step`: ``direction`` rows are the
        clients' terms of a mean over the ``len(sent)`` clients (``delta / S``), so each client's contribution is
        ``S`` times its row's vector-Jacobian product. ``extra_loss`` (computed on the server from public data and
        the private parameters, e.g. Panacea's graph loss) adds its ordinary gradient."""
        if sent.shape != direction.shape:
            raise ValueError(f"direction shape {tuple(direction.shape)} does not match sent {tuple(sent.shape)}")
        params = [param for group in optimizer.param_groups for param in group["params"] if param.requires_grad]
        size = sum(param.numel() for param in params)
        count = len(sent)
        total = torch.zeros(size, device=params[0].device, dtype=params[0].dtype)
        for client in range(count):  # one backward per client: its contribution alone is clipped
            grads = torch.autograd.grad(sent[client], params, direction[client].detach() * count,
                                        retain_graph=True, allow_unused=True)
            row = torch.cat([(torch.zeros_like(param) if grad is None else grad).flatten()
                             for grad, param in zip(grads, params, strict=True)])
            total = total + clip_rows(row.unsqueeze(0), self.plan.clip_norm)[0]
        if self.plan.noise_multiplier > 0:
            # one draw per (round, server step): the key numbers the step
            total = total + self.noise.gaussian((size,), self.noise_std(), total.device, self.round_index,
                                                "server_gradient", self.steps_taken).to(total.dtype)
        gradient = total / self.expected_clients
        optimizer.zero_grad(set_to_none=True)
        if extra_loss is not None:
            extra_loss.backward()
        for param, value in zip(params, gradient.split([param.numel() for param in params]), strict=True):
            param.grad = value.view_as(param) if param.grad is None else param.grad + value.view_as(param)
        optimizer.step()
        self.steps_taken += 1


def next_clip(delta: torch.Tensor, clip_norm: float, plan: PrivacyPlan, expected_clients: float, noise: NoiseSource,
              round_index: int) -> float:
    """Adaptive clipping: the noised share of this round's clients whose update was within ``clip_norm`` moves the
    clip geometrically towards the target quantile (each client's bit is shifted to +-1/2: sensitivity 1/2)."""
    assert plan.adaptive_quantile is not None and plan.quantile_noise is not None
    within = (torch.linalg.vector_norm(delta, dim=1) <= clip_norm).to(torch.float64) - 0.5
    count_noise = (float(noise.gaussian((1,), plan.quantile_noise, "cpu", round_index, "clip_quantile")[0])
                   if plan.noise_multiplier > 0 else 0.0)
    share = float(within.sum().cpu() + count_noise) / expected_clients + 0.5
    return clip_norm * math.exp(-plan.clip_learning_rate * (share - plan.adaptive_quantile))


# ---- what was spent ----------------------------------------------------------------------------------------------

@dataclass
class PrivacyLedger:
    """Every release a run made: central, the rounds whose noised sum reached the server's model (an empty cohort's
    noise included); local, how many noised uploads each client made (training and novel-client adaptation); and
    for both the training rounds and adaptation steps whose releases were made (``rounds``, ``novel_steps``). It
    is written beside the checkpoint after every release, so a resumed run knows where its releases stopped and
    never makes one of them again (:func:`graphfed.sim.checkpoint.resume` starts after the last)."""

    central_releases: int = 0
    uploads: dict[int, int] = field(default_factory=dict)
    rounds: int = 0  #: training rounds whose releases were made
    novel_steps: int = 0  #: novel-client adaptation steps whose (local DP) uploads were made

    def count_uploads(self, client_ids: torch.Tensor) -> None:
        for client in client_ids.tolist():
            self.uploads[int(client)] = self.uploads.get(int(client), 0) + 1

    def state(self) -> dict[str, Any]:
        return {"central_releases": self.central_releases, "rounds": self.rounds, "novel_steps": self.novel_steps,
                "uploads": {str(client): count for client, count in sorted(self.uploads.items())}}

    @classmethod
    def from_state(cls, state: Any) -> PrivacyLedger:
        """A ledger from :meth:`state` (a checkpoint's or the run folder's file); ValueError when malformed."""
        if not isinstance(state, dict) or not isinstance(state.get("central_releases"), int) \
                or not isinstance(state.get("uploads"), dict):
            raise ValueError("a privacy ledger holds central_releases (an integer) and uploads (client -> count)")
        uploads = {}
        for client, count in state["uploads"].items():
            if not str(client).isdigit() or not isinstance(count, int) or count < 0:
                raise ValueError(f"privacy ledger: upload count {count!r} of client {client!r}")
            uploads[int(client)] = count
        steps = {key: state.get(key, 0) for key in ("rounds", "novel_steps")}  # older ledgers lack them
        if not all(isinstance(value, int) and value >= 0 for value in steps.values()):
            raise ValueError(f"privacy ledger: rounds and novel_steps must be counts, got {steps}")
        return cls(max(0, state["central_releases"]), uploads, steps["rounds"], steps["novel_steps"])

    def merged(self, other: PrivacyLedger) -> PrivacyLedger:
        """The larger count of each kind: what either record saw was released."""
        clients = set(self.uploads) | set(other.uploads)
        return PrivacyLedger(max(self.central_releases, other.central_releases),
                             {c: max(self.uploads.get(c, 0), other.uploads.get(c, 0)) for c in clients},
                             max(self.rounds, other.rounds), max(self.novel_steps, other.novel_steps))

    def to_json(self) -> str:
        return json.dumps(self.state(), indent=1) + "\n"


# ---- accounting (dp-accounting) --------------------------------------------------------------------------------
def _event(noise_multiplier: float, rounds: int, sampling_rate: float | None) -> Any:
    import dp_accounting

    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    step = gaussian if sampling_rate is None else dp_accounting.PoissonSampledDpEvent(sampling_rate, gaussian)
    return dp_accounting.SelfComposedDpEvent(step, rounds)


def _accountant(kind: str) -> Callable[[], Any]:
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    return {"pld": pld_privacy_accountant.PLDAccountant, "rdp": rdp_privacy_accountant.RdpAccountant}[kind]


@cache
def epsilon(accountant: str, noise_multiplier: float, rounds: int, sampling_rate: float | None,
            delta: float) -> float:
    """Epsilon at ``delta`` of ``rounds`` Gaussian mechanisms with ``noise_multiplier`` (Poisson-subsampled at
    ``sampling_rate`` when given), from the library's ``accountant``; 0 for no rounds, inf without noise."""
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    account = _accountant(accountant)()
    account.compose(_event(noise_multiplier, rounds, sampling_rate))
    return float(account.get_epsilon(delta))


@cache
def calibrate_noise(accountant: str, target_epsilon: float, rounds: int, sampling_rate: float | None,
                    delta: float) -> float:
    """The smallest noise multiplier whose epsilon after ``rounds`` is at most ``target_epsilon`` (the library's
    ``calibrate_dp_mechanism``; seconds with PLD, more for large epsilons, whose small noise PLD resolves finely)."""
    import dp_accounting

    return float(dp_accounting.calibrate_dp_mechanism(
        _accountant(accountant), lambda noise: _event(noise, rounds, sampling_rate), target_epsilon, delta,
        tol=CALIBRATION_TOLERANCE))
