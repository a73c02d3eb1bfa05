"""Malicious clients as client behaviours (``attack:`` in the config).

A seeded set of training clients is malicious; the rest never change. Data attacks (``label_flip``, ``backdoor``)
rewrite the malicious clients' training rows once, when the clients' side of a run is built; update attacks
(``model_poisoning``, ``sign_flip``, ``scaling``, ``gaussian_noise``) rewrite what a malicious client uploads after
it trained honestly. Both are row masks over the clients, so the simulator's vectorised clients and a Flower node
(which builds the same federation from the run config and knows its partition id) behave identically.

Validation and test rows stay clean: every score measures what a model does on true data. A backdoor adds the
``backdoor`` evaluation split (every client's triggered non-target test rows, labelled with the target), whose
accuracy is the attack success rate. Defences live in :mod:`graphfed.attacks.defenses`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from graphfed.attacks.backdoor import blend, poison_rows, trigger_pattern, triggered_split
from graphfed.attacks.label_flip import flip_labels, flip_map
from graphfed.attacks.poisoning import forge_updates
from graphfed.config import DATA_ATTACKS, UPDATE_ATTACKS, AttackConfig, ConfigError, printable
from graphfed.core import rng
from graphfed.data.federation import Federation

__all__ = ["DATA_ATTACKS", "UPDATE_ATTACKS", "Attack", "build_attack"]


@dataclass
class Attack:
    """Which clients are malicious (``malicious [N]`` bool) and how they behave (``config``)."""

    config: AttackConfig
    malicious: torch.Tensor
    seed: int

    @property
    def active(self) -> bool:
        return self.config.kind != "none" and bool(self.malicious.any())

    @property
    def malicious_client_ids(self) -> torch.Tensor:
        return torch.nonzero(self.malicious).flatten()

    def poison(self, federation: Federation) -> Federation:
        """The federation as the clients see it: malicious clients' training rows rewritten by a data attack, and
        the ``backdoor`` split added for a backdoor (with no attacker too, so a clean run reports a clean ASR)."""
        kind = self.config.kind
        if kind not in DATA_ATTACKS:
            return federation
        train = federation.train
        owner, rows = train.row_owners()
        attacked = torch.zeros(len(train.y), dtype=torch.bool)
        attacked[rows] = self.malicious[owner]
        generator = rng.generator(self.seed, -1, "attack")  # the fixed patterns (flip map, trigger), not round 1's
        if kind == "label_flip":
            mapping = flip_map(federation.output_dim, self.config.flip, generator)
            return replace(federation, train=replace(train, y=flip_labels(train.y, attacked, mapping)))
        inputs = train.x
        trigger = trigger_pattern(federation.input_shape, float(inputs.min()), float(inputs.max()), generator)
        backdoor = triggered_split(federation.test, trigger, self.config.blend, self.config.target)
        if not self.malicious.any():
            return replace(federation, backdoor_test=backdoor)
        seeds = rng.client_seeds(self.seed, 0, "attack", self.malicious_client_ids)
        triggered = poison_rows(train, self.malicious_client_ids, self.config.poison_rate, seeds)
        shape = (-1, *[1] * (inputs.ndim - 1))
        x = torch.where(triggered.view(shape), blend(inputs, trigger, self.config.blend), inputs)
        y = torch.where(triggered, self.config.target, train.y)
        return replace(federation, train=replace(train, x=x, y=y), backdoor_test=backdoor)

    def forge(self, client_ids: torch.Tensor, delta: torch.Tensor, round_index: int) -> torch.Tensor:
        """``delta [S, dim]`` of ``client_ids`` as uploaded: malicious rows forged by an update attack, honest rows
        the same tensor values."""
        if self.config.kind not in UPDATE_ATTACKS:
            return delta
        rows = self.malicious[client_ids]
        if not rows.any():
            return delta
        seeds = rng.client_seeds(self.seed, round_index, "attack", client_ids[rows])
        forged = delta.clone()
        forged[rows] = forge_updates(self.config.kind, delta[rows], seeds, self.config.poison_lambda,
                                     self.config.scale, self.config.noise_std)
        return forged

    def describe(self, client_names: list[str]) -> dict[str, Any]:
        """What summary.json records about the attack."""
        settings = self.config.model_dump(mode="json", exclude={"clients"})
        return {**settings, "malicious_clients": [client_names[int(i)] for i in self.malicious_client_ids]}


def build_attack(config: AttackConfig, federation: Federation, seed: int) -> Attack:
    """The malicious clients of ``federation`` under ``config``: those named, else ``count`` (or ``fraction`` of the
    training clients, rounded) drawn from the run seed. Novel clients are never malicious (they never train)."""
    train_ids = federation.train_client_ids
    malicious = torch.zeros(federation.num_clients, dtype=torch.bool)
    if config.kind != "none":
        if config.kind in DATA_ATTACKS and federation.task != "classification":
            raise ConfigError(f"attack.kind: {config.kind} rewrites labels; {federation.name} is a regression task")
        if config.kind == "backdoor" and not 0 <= config.target < federation.output_dim:
            raise ConfigError(f"attack.target: {config.target} is not a class of {federation.name} "
                              f"(0..{federation.output_dim - 1})")
        if config.clients is not None:
            index = {name: i for i, name in enumerate(federation.client_names)}
            unknown = [name for name in config.clients if name not in index]
            if unknown:
                raise ConfigError(f"attack.clients: {printable(str(unknown[:5]))} are not clients of "
                                  f"{federation.name}")
            chosen = torch.tensor([index[name] for name in config.clients], dtype=torch.long)
            novel = chosen[federation.novel_mask[chosen]]
            if len(novel):
                raise ConfigError(f"attack.clients: {[federation.client_names[int(i)] for i in novel][:5]} are novel "
                                  f"clients, which never train")
        else:
            count = config.count if config.count is not None else math.floor(config.fraction * len(train_ids) + 0.5)
            if count >= len(train_ids):
                raise ConfigError(f"attack.count: {count} malicious clients leave none of the {len(train_ids)} "
                                  f"training clients honest")
            order = torch.randperm(len(train_ids), generator=rng.generator(seed, 0, "attack"))
            chosen = train_ids[order[:count]]
        malicious[chosen] = True
    return Attack(config, malicious, seed)
