"""Client-level differential privacy: clipping, Gaussian noise and its accounting (``privacy:`` in the config).

The unit protected is a whole client: a neighbouring federation adds or removes one client's every upload.

* ``local``: each client clips its update to ``clip_norm`` (L2) and adds ``N(0, (noise_multiplier * clip_norm)^2)``
  to every coordinate before it leaves (on Flower, on the SuperNode: the server never holds a raw update). Each
  round a client takes part in is one Gaussian mechanism of sensitivity ``clip_norm``; a client's epsilon composes
  the rounds it took part in (no amplification: the server sees each upload).
* ``central`` (a trusted server): the server clips each client's update, sums them, adds the noise once to the sum
  and divides by the expected cohort size (DP-FedAvg, McMahan et al., ICLR 2018, "Learning differentially private
  recurrent language models"). Clients are sampled Poisson (each with probability q = clients_per_round / training
  clients, independently, every round) so that the accounting's subsampling amplification is the sampling the
  engine does; epsilon composes ``rounds`` Poisson-subsampled Gaussian mechanisms. With ``adaptive_quantile``
  the clip follows a quantile of the update norms (Andrew et al., NeurIPS 2021, "Differentially private learning
  with adaptive clipping"): each round the server also releases the noised count of clients whose update was
  within the clip (each client's bit shifted to +-1/2, noise std ``quantile_noise``) and moves the clip
  geometrically towards the quantile. Both releases are Gaussian queries of the same clients, so together they
  are one Gaussian mechanism of noise multiplier ``(z_sum^-2 + (2 quantile_noise)^-2)^(-1/2)`` (their Theorem 1):
  the accounted ``noise_multiplier`` is that total, and the sum's own noise ``z_sum`` is set to meet it.

The accounting is Google's ``dp-accounting`` library (``pld``: privacy loss distributions, tight; ``rdp``: Renyi
DP, an upper bound): nothing here computes an epsilon itself. ``target_epsilon`` is turned into a noise multiplier
by the library's own calibration for the run's planned rounds (local: the worst case, a client in every round).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from graphfed.config import ConfigError, PrivacyConfig
from graphfed.core import rng

#: the calibration's tolerance on the noise multiplier (its epsilon then lies well within 1 % of the target)
CALIBRATION_TOLERANCE = 1e-5


@dataclass(frozen=True)
class PrivacyPlan:
    """A run's mechanism, resolved from its config: the noise multiplier (calibrated when a target epsilon was
    given), delta (default 0.1 / training clients), and for ``central`` the Poisson sampling rate."""

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

    def epsilon_of_rounds(self, rounds: int) -> float:
        """The (client-level) epsilon at ``self.delta`` after ``rounds`` mechanisms: ``rounds`` a client took part
        in (local), or rounds run (central)."""
        return epsilon(self.accountant, self.noise_multiplier, rounds, self.sampling_rate, self.delta)

    def record(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "clip_norm": self.clip_norm, "noise_multiplier": self.noise_multiplier,
                "delta": self.delta, "accountant": self.accountant,
                "sampling": (f"poisson, q = {self.sampling_rate:.6g} per client and round" if self.sampling_rate
                             else "none: every upload is noised where it is made"),
                **({"adaptive_quantile": self.adaptive_quantile, "clip_learning_rate": self.clip_learning_rate,
                    "quantile_noise": self.quantile_noise, "sum_noise_multiplier": self.sum_noise_multiplier}
                   if self.adaptive_quantile is not None else {})}


def plan_privacy(config: PrivacyConfig, num_train_clients: int, clients_per_round: int, rounds: int) -> PrivacyPlan:
    """Resolve ``config`` for a federation of ``num_train_clients`` training clients (the same on the server and
    on every node: calibration is deterministic)."""
    delta = config.delta if config.delta is not None else 0.1 / num_train_clients
    rate = min(1.0, clients_per_round / num_train_clients) if config.mechanism == "central" else None
    noise = config.noise_multiplier
    if config.mechanism != "none" and noise is None:
        assert config.target_epsilon is not None  # the config's validator asks for one of the two
        noise = calibrate_noise(config.accountant, config.target_epsilon, rounds, rate, delta)
    adaptive = config.adaptive_quantile
    quantile_noise = None
    if adaptive is not None:
        # Andrew et al. take expected clients / 20; a small cohort would then spend most of the budget on the
        # count, so the default also lets the count spend at most a tenth of it ((2 s)^-2 <= z^-2 / 10)
        quantile_noise = config.quantile_noise or max(min(clients_per_round, num_train_clients) / 20,
                                                      math.sqrt(10) * float(noise or 0.0) / 2)
    plan = PrivacyPlan(config.mechanism, config.clip_norm, float(noise or 0.0), delta, config.accountant, rounds,
                       rate, adaptive, config.clip_learning_rate, quantile_noise)
    plan.sum_noise_multiplier  # noqa: B018 - a count noise that leaves the sum no budget is an error now
    return plan


# ---- the mechanisms --------------------------------------------------------------------------------------------
def clip_rows(delta: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Each row scaled to L2 norm at most ``clip_norm`` (rows already within it are left exactly as they are)."""
    if math.isinf(clip_norm):
        return delta
    norms = torch.linalg.vector_norm(delta, dim=1, keepdim=True)
    return delta * torch.clamp(clip_norm / norms.clamp_min(torch.finfo(delta.dtype).tiny), max=1.0)


def gaussian_noise(shape: tuple[int, ...], std: float, seed: int, device: torch.device | str) -> torch.Tensor:
    """``N(0, std^2)`` per value from a seeded stream, drawn on the host (the same numbers on every device)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(shape, generator=generator, device="cpu") * std).to(device)


def privatize_uploads(delta: torch.Tensor, plan: PrivacyPlan, seed: int, round_index: int,
                      client_ids: torch.Tensor) -> torch.Tensor:
    """``local``: each client's update clipped and noised, with one noise stream per (run, round, client), so a
    client adds the same noise wherever it trains."""
    clipped = clip_rows(delta, plan.clip_norm)
    if plan.noise_multiplier == 0:
        return clipped
    std = plan.noise_multiplier * plan.clip_norm
    seeds = rng.client_seeds(seed, round_index, "privacy", client_ids)
    noise = torch.stack([gaussian_noise((delta.shape[1],), std, s, delta.device) for s in seeds])
    return clipped + noise.to(delta.dtype)


def noised_mean(delta: torch.Tensor, plan: PrivacyPlan, expected_clients: float, seed: int,
                round_index: int, clip_norm: float | None = None) -> torch.Tensor:
    """``central``: ``(sum of the clipped updates + N(0, (z_sum * clip)^2 I)) / expected_clients`` (``[dim]``;
    ``clip_norm``: this round's adaptive clip, default the plan's). Dividing by the expected cohort, not the actual
    one, keeps the cohort's size private too."""
    clip = plan.clip_norm if clip_norm is None else clip_norm
    total = clip_rows(delta, clip).sum(0)
    if plan.noise_multiplier > 0:
        std = plan.sum_noise_multiplier * clip
        total = total + gaussian_noise((delta.shape[1],), std, rng.stream_seed(seed, round_index, "privacy"),
                                       delta.device).to(delta.dtype)
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
    server, which still reads the raw updates."""

    plan: PrivacyPlan
    expected_clients: float
    seed: int
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
        count = len(sent)
        rows = []
        for client in range(count):  # one backward per client: its contribution alone is clipped
            grads = torch.autograd.grad(sent[client], params, direction[client].detach() * count,
                                        retain_graph=True, allow_unused=True)
            rows.append(torch.cat([(torch.zeros_like(param) if grad is None else grad).flatten()
                                   for grad, param in zip(grads, params, strict=True)]))
        total = clip_rows(torch.stack(rows), self.plan.clip_norm).sum(0)
        if self.plan.noise_multiplier > 0:
            # one stream per (round, server step): the extra key slot numbers the step
            seed = rng.stream_seed(self.seed, self.round_index, "server_gradient", self.steps_taken)
            total = total + gaussian_noise((total.numel(),), self.noise_std(), seed, total.device).to(total.dtype)
        gradient = total / self.expected_clients
        optimizer.zero_grad(set_to_none=True)
        if extra_loss is not None:
            extra_loss.backward()
        for param, value in zip(params, gradient.split([param.numel() for param in params]), strict=True):
            param.grad = value.view_as(param) if param.grad is None else param.grad + value.view_as(param)
        optimizer.step()
        self.steps_taken += 1


def next_clip(delta: torch.Tensor, clip_norm: float, plan: PrivacyPlan, expected_clients: float, seed: int,
              round_index: int) -> float:
    """Adaptive clipping: the noised share of this round's clients whose update was within ``clip_norm`` moves the
    clip geometrically towards the target quantile (each client's bit is shifted to +-1/2: sensitivity 1/2)."""
    assert plan.adaptive_quantile is not None and plan.quantile_noise is not None
    within = (torch.linalg.vector_norm(delta, dim=1) <= clip_norm).to(torch.float64) - 0.5
    noise = gaussian_noise((1,), plan.quantile_noise, rng.stream_seed(seed, round_index, "clip_quantile"),
                           "cpu").double() if plan.noise_multiplier > 0 else torch.zeros(1, device="cpu")
    share = float((within.sum().cpu() + noise[0]) / expected_clients) + 0.5
    return clip_norm * math.exp(-plan.clip_learning_rate * (share - plan.adaptive_quantile))


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
