"""graphfed: graph-relational personalised federated learning."""

from graphfed.config import RunConfig, register_name_check

__version__ = "0.1.0"


def _check_names(config: RunConfig) -> None:
    # imported on first use: the registries import torch, which `graphfed list` and `--help` never need
    from graphfed.registries import check_names

    check_names(config)


register_name_check(_check_names)
