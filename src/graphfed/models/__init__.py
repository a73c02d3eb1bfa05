"""Target-model registry: ``build_model(name, federation, **options)``.

Built-in models and users' own share one registry: :func:`register_model` adds a factory from Python, and an
installed package adds its models through the ``graphfed.models`` entry-point group (read the first time a model
name is looked up). See docs/how-to/own-model.md.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from graphfed.config import ConfigError
from graphfed.data.federation import Federation
from graphfed.models.base import TargetModel
from graphfed.models.char_transformer import CharTransformer
from graphfed.models.cnn import PflCNN, SmallCNN
from graphfed.models.cnn_bn import CNNBN
from graphfed.models.gru import GRUForecaster
from graphfed.models.leaf_lstm import LeafLSTM
from graphfed.models.lenet import LeNet
from graphfed.models.mlp import MLP
from graphfed.models.resnet_like import ResNetLike


def _mlp(fed: Federation, hidden: int = 16, num_layers: int = 3) -> TargetModel:
    in_features = 1
    for s in fed.input_shape:
        in_features *= s
    return MLP(in_features, fed.output_dim, hidden=hidden, num_layers=num_layers)


def _cnn(fed: Federation, channels: int = 16, hidden: int = 64) -> TargetModel:
    return SmallCNN(fed.input_shape, fed.output_dim, channels=channels, hidden=hidden)


def _pfl_cnn(fed: Federation) -> TargetModel:
    return PflCNN(fed.input_shape, fed.output_dim)


def _resnet_like(fed: Federation, arch: str = "arch0", width: int = 8) -> TargetModel:
    return ResNetLike(fed.input_shape, fed.output_dim, arch=arch, width=width)


def _cnn_bn(fed: Federation, channels: int = 32, hidden: int = 512, kernel_size: int = 5) -> TargetModel:
    return CNNBN(fed.input_shape, fed.output_dim, channels=channels, hidden=hidden, kernel_size=kernel_size)


def _lenet(fed: Federation, channels: int = 16, channels2: int | None = None, hidden: int = 120,
           hidden2: int = 84) -> TargetModel:
    return LeNet(fed.input_shape, fed.output_dim, channels=channels, channels2=channels2, hidden=hidden,
                 hidden2=hidden2)


def _gru(fed: Federation, hidden: int = 100) -> TargetModel:
    # A recurrence over the input's first axis only means something for series (regression on windows).
    if fed.task != "regression" or len(fed.input_shape) not in (1, 2):
        raise ConfigError(f"model.name: gru forecasts a series of shape (steps,) or (steps, features) for "
                          f"regression datasets; {fed.name} is {fed.task} with input shape {fed.input_shape}")
    features = fed.input_shape[1] if len(fed.input_shape) == 2 else 1
    return GRUForecaster(fed.input_shape[0], fed.output_dim, hidden=hidden, input_features=features)


def _text(fed: Federation, model: str) -> tuple[int, int]:
    """(vocabulary, context) of a next-character federation: windows of character classes, one class predicted (a
    federation says so by its alphabet; a bare shape, as a test or a benchmark builds, is taken at its word)."""
    if (fed.task != "classification" or len(fed.input_shape) != 1
            or (isinstance(fed, Federation) and fed.alphabet is None)):
        raise ConfigError(f"model.name: {model} reads windows of characters (input shape (T,)) and predicts the next "
                          f"one; {fed.name} is {fed.task} with input shape {fed.input_shape} (use dataset.name="
                          f"shakespeare)")
    if isinstance(fed, Federation) and fed.input_scaling is not None:
        raise ConfigError(f"dataset.standardize: {model} reads character classes, which scaling would turn into "
                          f"other numbers; set dataset.standardize=none")
    return fed.output_dim, fed.input_shape[0]


def _char_transformer(fed: Federation, width: int = 128, layers: int = 4, heads: int = 4,
                      adapter: dict[str, Any] | None = None) -> TargetModel:
    vocab, context = _text(fed, "char-transformer")
    return CharTransformer(vocab, context, width=width, layers=layers, heads=heads, adapter=adapter)


def _leaf_lstm(fed: Federation, embedding: int = 8, hidden: int = 256, layers: int = 2) -> TargetModel:
    vocab, _ = _text(fed, "leaf-lstm")
    return LeafLSTM(vocab, embedding=embedding, hidden=hidden, layers=layers)


MODELS: dict[str, tuple[Callable[..., TargetModel], str]] = {
    "mlp": (_mlp, "multi-layer perceptron (options: hidden=16, num_layers=3)"),
    "cnn": (_cnn, "2 conv + 2 linear layers for (C, H, W) images (options: channels=16, hidden=64)"),
    "pfl-cnn": (_pfl_cnn, "pfl-research's CIFAR-10 benchmark CNN: 3x3 conv (32), 3x3 conv (64), 2x2 max-pool, "
                "linear (128), linear; dropout left out (no options)"),
    "resnet-like": (_resnet_like, "FLHA-GHN's architecture family: arch0 (ResNet-18 style), arch1 (10 layers, no "
                    "skip), arch2 (skips first), arch3 (skips last), small (4 layers), plain4/7/10/13 (chains of one "
                    "layer type); batch-statistics BN; model.architectures gives clients different members "
                    "(options: arch=arch0, width=8)"),
    "cnn-bn": (_cnn_bn, "FedAGHN's 4-layer CNN: 2x (5x5 conv, batch-statistics BN, ReLU, pool) + 2 linear layers "
               "(options: channels=32, hidden=512, kernel_size=5)"),
    "lenet": (_lenet, "LeNet-style CNN of pFedHN on CIFAR (pFedGAT uses 3 conv + 3 FC): 2x (5x5 conv, ReLU, "
              "2x2 max-pool) + 3 linear layers, images >= 16x16 (options: channels=16, channels2=2*channels, "
              "hidden=120, hidden2=84)"),
    "gru": (_gru, "1-layer GRU over the input steps + linear head to all output steps, for series regression "
            "(metr-la-week: 32,112 parameters at hidden=100; options: hidden=100)"),
    "char-transformer": (_char_transformer, "small causal character transformer (pre-LayerNorm decoder blocks, "
                         "scaled_dot_product_attention) predicting the next character of a window (shakespeare); "
                         "adapter: {kind: lora, rank, alpha, targets} freezes the base (model.base) and trains LoRA "
                         "factors alone (options: width=128, layers=4, heads=4, adapter=none)"),
    "leaf-lstm": (_leaf_lstm, "LEAF's Shakespeare model: character embedding, stacked LSTM, linear head over the "
                  "characters (options: embedding=8, hidden=256, layers=2)"),
}


ENTRY_POINT_GROUP = "graphfed.models"
#: the models registered by users (register_model or entry points): checked to run many clients at once
PLUGIN_MODELS: set[str] = set()


class ModuleModel(TargetModel):
    """A user's plain ``nn.Module`` as a target model: its forward is the model's; ``head`` names its output layer
    (a submodule, e.g. ``"fc"``) for methods that personalise the head (FedRep, FedRoD, ...), and a ``features(x)``
    method, where the module has one, is what those methods' heads read."""

    def __init__(self, module: nn.Module, head: str | None) -> None:
        super().__init__()
        self.net = module
        if head is not None:
            try:
                module.get_submodule(head)
            except AttributeError:
                raise ConfigError(f"register_model: head {head!r} is not a submodule of "
                                  f"{type(module).__name__}") from None
        self.head_module = f"net.{head}" if head is not None else ""

    @property
    def head_names(self) -> tuple[str, ...]:
        """None without ``head``: methods that personalise the head then refuse the model by name."""
        return super().head_names if self.head_module else ()

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self.net, "features"):
            raise ConfigError(f"model {type(self.net).__name__} has no features(x) method: define one (what its head "
                              f"reads) for methods that need a representation")
        return self.net.features(x)

    def forward(self, x: torch.Tensor, features_only: bool = False) -> torch.Tensor:
        return self.features(x) if features_only else self.net(x)


def register_model(name: str, factory: Callable[..., nn.Module], description: str = "", *,
                   head: str | None = None, replace: bool = False) -> None:
    """Make ``model.name: <name>`` build ``factory(federation, **model.options)``.

    The factory reads what it needs from the federation (``input_shape``, ``output_dim``, ``task``) and returns a
    :class:`TargetModel` or any ``nn.Module`` (wrapped as :class:`ModuleModel`; ``head`` names its output layer).
    Its keyword parameters are the model's options. A name already registered is refused unless ``replace=True``.
    The first time it is built, the model is run for two clients at once under ``torch.func.vmap``; one that cannot
    be is a one-line ConfigError saying what to change."""
    if not name or not isinstance(name, str):
        raise ValueError("a model needs a non-empty name")
    if name in MODELS and not replace:
        raise ValueError(f"model {name!r} is already registered; pass replace=True to replace it")

    def build(fed: Federation, **options: Any) -> TargetModel:
        module = factory(fed, **options)
        if isinstance(module, TargetModel):
            return module
        if not isinstance(module, nn.Module):
            raise ConfigError(f"model {name!r}: its factory returned {type(module).__name__}, not an nn.Module")
        return ModuleModel(module, head)

    build.__signature__ = inspect.signature(factory)  # type: ignore[attr-defined]  # options = its keywords
    MODELS[name] = (build, description or f"{name} (registered by {getattr(factory, '__module__', 'a plugin')})")
    PLUGIN_MODELS.add(name)


@functools.cache
def load_model_plugins() -> tuple[str, ...]:
    """Register the models installed packages declare in the ``graphfed.models`` entry-point group (once): the
    entry point's name is the model's name, its object the factory (``head`` read from its ``head`` attribute)."""
    loaded = []
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in MODELS:
            continue  # a built-in or an explicit register_model wins
        factory = entry.load()
        register_model(entry.name, factory, getattr(factory, "description", ""), head=getattr(factory, "head", None))
        loaded.append(entry.name)
    return tuple(loaded)


def check_vectorisable(name: str, model: TargetModel, federation: Federation) -> None:
    """Run two clients' weights at once on one row each (what every method does every round): a model that cannot
    is a one-line ConfigError naming the model and the fix."""
    params = {key: torch.stack([value.detach(), value.detach()]) for key, value in model.named_parameters()}
    x = torch.zeros(2, 1, *federation.input_shape, device=next(model.parameters()).device)
    try:
        with torch.no_grad():
            model.batched_forward(params, x)
    except Exception as err:  # anything vmap refuses: in-place updates, .item(), data-dependent branches...
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise ConfigError(f"model {name!r} cannot run many clients at once under torch.func.vmap ({type(err).__name__}:"
                          f" {reason}); make its forward a pure function of its input and parameters (no in-place "
                          f"updates of parameters or buffers, no .item() or Python branches on tensor values), or "
                          f"subclass graphfed.models.TargetModel and override batched_forward") from None


def check_model_options(name: str, options: dict[str, Any]) -> None:
    """Every option is one the model's builder takes, and every size is an integer >= 1 (checked when the
    config is read, before any data is built)."""
    builder, _ = MODELS[name]
    parameters = {key: p for key, p in inspect.signature(builder).parameters.items() if key != "fed"}
    for key, value in options.items():
        if key not in parameters:
            raise ConfigError(f"model.options.{key}: unknown option; options of '{name}': "
                              f"{', '.join(parameters) or 'none'}")
        default = parameters[key].default
        size = isinstance(default, int) or (default is None and key.startswith(("channels", "hidden")))
        if size and (isinstance(value, bool) or not isinstance(value, int) or value < 1 or value > 1_000_000):
            raise ConfigError(f"model.options.{key}: must be an integer from 1 to 1,000,000, got {value!r}")


def build_model(name: str, federation: Federation, options: dict[str, Any] | None = None) -> TargetModel:
    if name not in MODELS:
        load_model_plugins()
    if name not in MODELS:
        raise ConfigError(f"model.name: unknown model '{name}'; allowed: {', '.join(sorted(MODELS))}")
    builder, _ = MODELS[name]
    check_model_options(name, options or {})
    try:
        model = builder(federation, **(options or {}))
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"model.options: {err}") from None
    if name in PLUGIN_MODELS:
        check_vectorisable(name, model, federation)
    return model


__all__ = ["MODELS", "ModuleModel", "TargetModel", "build_model", "check_model_options", "load_model_plugins",
           "register_model"]
