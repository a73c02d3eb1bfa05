"""Target-model registry: ``build_model(name, federation, **options)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphfed.config import ConfigError
from graphfed.data.federation import Federation
from graphfed.models.base import TargetModel
from graphfed.models.cnn import SmallCNN
from graphfed.models.cnn_bn import CNNBN
from graphfed.models.mlp import MLP


def _mlp(fed: Federation, hidden: int = 16, num_layers: int = 3) -> TargetModel:
    in_features = 1
    for s in fed.input_shape:
        in_features *= s
    return MLP(in_features, fed.output_dim, hidden=hidden, num_layers=num_layers)


def _cnn(fed: Federation, channels: int = 16, hidden: int = 64) -> TargetModel:
    return SmallCNN(fed.input_shape, fed.output_dim, channels=channels, hidden=hidden)


def _cnn_bn(fed: Federation, channels: int = 32, hidden: int = 512, kernel_size: int = 5) -> TargetModel:
    return CNNBN(fed.input_shape, fed.output_dim, channels=channels, hidden=hidden, kernel_size=kernel_size)


MODELS: dict[str, tuple[Callable[..., TargetModel], str]] = {
    "mlp": (_mlp, "multi-layer perceptron (options: hidden=16, num_layers=3)"),
    "cnn": (_cnn, "2 conv + 2 linear layers for (C, H, W) images (options: channels=16, hidden=64)"),
    "cnn-bn": (_cnn_bn, "FedAGHN's 4-layer CNN: 2x (5x5 conv, batch-statistics BN, ReLU, pool) + 2 linear layers "
               "(options: channels=32, hidden=512, kernel_size=5)"),
}


def build_model(name: str, federation: Federation, options: dict[str, Any] | None = None) -> TargetModel:
    if name not in MODELS:
        raise ConfigError(f"model.name: unknown model '{name}'; allowed: {', '.join(sorted(MODELS))}")
    builder, _ = MODELS[name]
    try:
        return builder(federation, **(options or {}))
    except TypeError as err:
        raise ConfigError(f"model.options: {err}") from err


__all__ = ["MODELS", "TargetModel", "build_model"]
