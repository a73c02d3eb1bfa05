"""A config's names checked against the registries of datasets, models and methods.

``graphfed.config`` validates fields without importing the registries (they import it); this module imports them
and is registered as the config's name check by ``graphfed/__init__.py``, so ``dataset.name``, ``model.name``,
``method.name`` and their options are checked whenever a config is validated, user-registered datasets included.
"""

from __future__ import annotations

from graphfed.config import RunConfig
from graphfed.data import DATASETS
from graphfed.errors import ConfigError
from graphfed.methods import MIXED_ARCHITECTURE_METHODS
from graphfed.models import MODELS, check_model_options, load_model_plugins
from graphfed.models.family import check_architectures
from graphfed.setup import resolve_method


def check_names(config: RunConfig) -> None:
    """ConfigError (one line, naming the field) when a name or option is not in its registry."""
    if config.dataset.name not in DATASETS:
        allowed = ", ".join(sorted(DATASETS))
        raise ConfigError(f"dataset.name: unknown dataset '{config.dataset.name}'; allowed: {allowed}")
    if config.model.name not in MODELS:
        load_model_plugins()
    if config.model.name not in MODELS:
        raise ConfigError(f"model.name: unknown model '{config.model.name}'; allowed: {', '.join(sorted(MODELS))}")
    check_model_options(config.model.name, config.model.options)
    wire = resolve_method(config).cls.architectures
    if config.model.architectures is None and wire in ("ghn", "teacher"):
        raise ConfigError(f"method.name: '{config.method.name}' federates the clients' own architectures; set "
                         f"model.architectures (e.g. model.name=resnet-like, model.architectures=[arch0, arch1])")
    if config.model.architectures is not None:
        check_architectures(config.model.name, config.model.options, config.model.architectures)
        if wire == "shared":
            raise ConfigError(f"method.name: '{config.method.name}' runs one architecture on every client; with "
                             f"model.architectures use {', '.join(MIXED_ARCHITECTURE_METHODS)}")
