"""The client side of graphfed, below the methods and both engines.

- :mod:`~graphfed.client.contract`: what a method's client side is (``ClientRule``), what it may know
  (``ClientSetting``, ``LocalTraining``) and the step it combines (``LocalStep``);
- :mod:`~graphfed.client.training` and :mod:`~graphfed.client.evaluation`: the one training loop and the one
  evaluation routine, S clients at once (``ClientScores`` is also what a Flower node sends back);
- :mod:`~graphfed.client.executor`: where client work runs (``ClientExecutor``; in this process,
  ``ClientRuntime``).

Methods, attacks, the simulator and the Flower client import this package; it imports models, data and core only.
"""
