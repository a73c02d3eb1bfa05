"""Method registry. One file per algorithm; each registers its class here."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from graphfed.config import error_message
from graphfed.errors import ConfigError
from graphfed.methods.apfl import Apfl
from graphfed.methods.base import Method, MethodContext, MethodOptions
from graphfed.methods.cfl import CFL
from graphfed.methods.ditto import Ditto
from graphfed.methods.fedaghn import FedAGHN
from graphfed.methods.fedah import FedAH
from graphfed.methods.fedala import FedALA
from graphfed.methods.fedamp import FedAMP, HFedAMP
from graphfed.methods.fedavg import FedAvg, FedAvgFT
from graphfed.methods.fedbabu import FedBABU
from graphfed.methods.fedbn import FedBN
from graphfed.methods.fedcp import FedCP
from graphfed.methods.feddyn import FedDyn
from graphfed.methods.fedfomo import FedFomo
from graphfed.methods.fedpac import FedPAC
from graphfed.methods.fedper import FedPer
from graphfed.methods.fedprox import FedProx, FedProxFT
from graphfed.methods.fedrep import FedRep
from graphfed.methods.fedrod import FedRoD
from graphfed.methods.flha_distill import FlhaDistill
from graphfed.methods.flha_ghn import FlhaGhn
from graphfed.methods.knnper import KNNPer
from graphfed.methods.lgfedavg import LGFedAvg
from graphfed.methods.local import Local
from graphfed.methods.moon import Moon
from graphfed.methods.panacea import Panacea, PanaceaGN, PanaceaMLP
from graphfed.methods.perfedavg import PerFedAvg
from graphfed.methods.pfedgat import PFedGAT
from graphfed.methods.pfedgraph import PFedGraph
from graphfed.methods.pfedhn import PFedHN
from graphfed.methods.pfedla import PFedLA
from graphfed.methods.pfedme import PFedMe
from graphfed.methods.scaffold import Scaffold
from graphfed.methods.sfl import SFL

METHODS: dict[str, type[Method]] = {
    cls.name: cls for cls in (Local, FedAvg, FedAvgFT, PFedHN, Panacea, PanaceaGN, PanaceaMLP, FedAGHN, PFedGAT,
                              SFL, FedAMP, HFedAMP, CFL, PFedGraph, PFedLA,
                              FedProx, FedProxFT, Ditto, PFedMe, PerFedAvg, FedRep, FedALA, FedRoD, KNNPer, FedCP,
                              FedPAC, FedAH, FlhaGhn, FlhaDistill, FedPer, LGFedAvg, FedBN, FedBABU, Scaffold,
                              FedDyn, Moon, Apfl, FedFomo)
}
#: methods that federate clients of different architectures (``model.architectures``)
MIXED_ARCHITECTURE_METHODS = tuple(name for name, cls in METHODS.items() if cls.architectures != "shared")


def method_class(name: str) -> type[Method]:
    """The registered class of ``name`` (``graphfed.setup.resolve_method`` resolves a config's method)."""
    if name not in METHODS:
        raise ConfigError(f"method.name: unknown method '{name}'; allowed: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def parse_options(cls: type[Method], options: dict[str, Any]) -> MethodOptions:
    """Validate ``method.options`` against ``cls``'s typed options; one-line error on failure."""
    try:
        return cls.Options(**options)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        allowed = ", ".join(sorted(cls.Options.model_fields))
        raise ConfigError(f"method.options.{field}: {error_message(first)} (options of '{cls.name}': {allowed})"
                          ) from None


__all__ = ["METHODS", "MIXED_ARCHITECTURE_METHODS", "Method", "MethodContext", "method_class", "parse_options"]
