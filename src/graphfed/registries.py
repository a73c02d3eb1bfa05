"""A config's names checked against the registries of datasets, models and methods.

``graphfed.config`` validates fields without importing the registries (they import it); this module imports them
and is registered as the config's name check by ``graphfed/__init__.py``, so ``dataset.name``, ``model.name``,
``method.name`` and their options are checked whenever a config is validated, user-registered datasets included.
"""

from __future__ import annotations

from graphfed.config import RunConfig
from graphfed.data import DATASETS
from graphfed.methods import MIXED_ARCHITECTURE_METHODS, method_class, parse_options
from graphfed.models import MODELS, check_model_options
from graphfed.models.family import check_architectures


def check_names(config: RunConfig) -> None:
    """ValueError (one line, naming the field) when a name or option is not in its registry."""
    if config.dataset.name not in DATASETS:
        allowed = ", ".join(sorted(DATASETS))
        raise ValueError(f"dataset.name: unknown dataset '{config.dataset.name}'; allowed: {allowed}")
    if config.model.name not in MODELS:
        raise ValueError(f"model.name: unknown model '{config.model.name}'; allowed: {', '.join(sorted(MODELS))}")
    check_model_options(config.model.name, config.model.options)
    parse_options(config.method.name, config.method.options)
    wire = method_class(config.method.name).architectures
    if config.model.architectures is None and wire in ("ghn", "teacher"):
        raise ValueError(f"method.name: '{config.method.name}' federates the clients' own architectures; set "
                         f"model.architectures (e.g. model.name=resnet-like, model.architectures=[arch0, arch1])")
    if config.model.architectures is not None:
        check_architectures(config.model.name, config.model.options, config.model.architectures)
        if wire == "shared":
            raise ValueError(f"method.name: '{config.method.name}' runs one architecture on every client; with "
                             f"model.architectures use {', '.join(MIXED_ARCHITECTURE_METHODS)}")
