"""Heterogeneous client architectures: which architecture each client runs (``model.architectures``).

A federation may give each client its own member of a model family (the values of the model's ``arch`` option,
e.g. FLHA-GHN's ``arch0``..``arch3`` of ``resnet-like``). The engines group the clients of a round by architecture
and train each group vectorised; every method states (``Method.architectures``) whether it can federate mixed
architectures and what travels on the wire:

- ``shared``: one architecture for all clients; such methods refuse ``model.architectures``;
- ``own``: each client's own architecture's parameters, zero-padded to the largest member (Local, pFedHN with
  per-architecture heads); a client reads the first ``dim`` values of its row;
- ``ghn``: the method's graph hypernetwork (FLHA-GHN); every client receives the same-sized GHN weights and turns
  them into weights for its own architecture;
- ``teacher``: one shared teacher architecture on every client (FLHA-distillation); a client's own architecture
  appears only in its evaluation network.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from graphfed.config import ConfigError
from graphfed.core.params import ParamSpec
from graphfed.models.base import TargetModel


def check_architectures(model_name: str, options: dict[str, Any], architectures: list[str]) -> None:
    """``model.architectures`` names values of the model's ``arch`` option, which ``model.options`` leaves unset."""
    from graphfed.models import MODELS

    builder, _ = MODELS[model_name]
    if "arch" not in inspect.signature(builder).parameters:
        families = [name for name, (build, _) in MODELS.items() if "arch" in inspect.signature(build).parameters]
        raise ValueError(f"model.architectures: model '{model_name}' has one architecture; models with an 'arch' "
                         f"option: {', '.join(families)}")
    if "arch" in options:
        raise ValueError("model.options.arch: set either it (one architecture) or model.architectures, not both")
    from graphfed.models.resnet_like import ARCHITECTURES

    unknown = [arch for arch in architectures if arch not in ARCHITECTURES]
    if unknown:
        raise ValueError(f"model.architectures: unknown architecture(s) {unknown}; allowed: {', '.join(ARCHITECTURES)}")


@dataclass
class ArchitectureFamily:
    """The architectures of a federation and who runs which."""

    names: tuple[str, ...]  # distinct architectures, in config order
    models: tuple[TargetModel, ...]  # one seeded instance each (its parameters are that architecture's init)
    assignment: torch.Tensor  # [N] int64: index into ``names`` of each client's architecture
    #: builds the seeded instance of any member of the model family by name (a teacher, the GHN's layer types)
    member: Callable[[str], TargetModel]
    #: every architecture the model family defines (its predefined layer types come from these)
    catalogue: tuple[str, ...]

    def __post_init__(self) -> None:
        self.specs = tuple(ParamSpec.from_module(model) for model in self.models)
        self.init_weights = tuple(spec.flatten_module(model) for spec, model in zip(self.specs, self.models,
                                                                                     strict=True))

    @property
    def max_dim(self) -> int:
        return max(spec.dim for spec in self.specs)

    def to(self, device: torch.device) -> ArchitectureFamily:
        """The family with its architectures' instances (and so their initial weights) on ``device``."""
        return replace(self, models=tuple(model.to(device) for model in self.models))

    def groups(self, client_ids: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """``(architecture index, positions in client_ids)`` for each architecture present, in index order."""
        of_clients = self.assignment[client_ids]
        return [(int(arch), torch.nonzero(of_clients == arch).flatten()) for arch in of_clients.unique()]

    def padded_init(self, client_ids: torch.Tensor) -> torch.Tensor:
        """``[S, max_dim]``: each client's architecture's initial weights, zero-padded (the ``own`` wire)."""
        rows = torch.zeros(len(client_ids), self.max_dim, device=self.init_weights[0].device)
        for arch, positions in self.groups(client_ids):
            rows[positions, :self.specs[arch].dim] = self.init_weights[arch]
        return rows

    def counts(self) -> dict[str, int]:
        return {name: int((self.assignment == i).sum()) for i, name in enumerate(self.names)}


def build_family(model_name: str, options: dict[str, Any], architectures: list[str],
                 architecture_of: list[str] | None, federation: Any, seed: int) -> ArchitectureFamily:
    """Seeded instances of ``architectures`` and the client -> architecture assignment (round-robin by default)."""
    from graphfed.core import rng
    from graphfed.models import build_model

    num_clients = federation.num_clients
    if architecture_of is not None:
        if len(architecture_of) != num_clients:
            raise ConfigError(f"model.architecture_of: {len(architecture_of)} entries for {num_clients} clients")
        assignment = torch.tensor([architectures.index(arch) for arch in architecture_of])
    else:
        assignment = torch.arange(num_clients) % len(architectures)
    from graphfed.models.resnet_like import ARCHITECTURES

    def member(arch: str) -> TargetModel:
        # each architecture's initialisation has its own stream: adding a member changes no other member's init
        torch.manual_seed(rng.stream_seed(seed, 0, "architecture", ARCHITECTURES.index(arch)))
        return build_model(model_name, federation, {**options, "arch": arch})

    return ArchitectureFamily(tuple(architectures), tuple(member(arch) for arch in architectures), assignment,
                              member, ARCHITECTURES)
