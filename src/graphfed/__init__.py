"""graphfed: graph-relational personalised federated learning."""

__version__ = "0.1.0"
