"""The single-machine engine: vectorised client training, evaluation and the round loop."""
