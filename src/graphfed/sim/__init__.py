"""The single-machine engine: the one round loop (``engine.py``) and its checkpoint; client work runs in
``graphfed.client``."""
