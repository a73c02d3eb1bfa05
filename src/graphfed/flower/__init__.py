"""Run any graphfed method on Flower (``pip install 'graphfed[flower]'``).

``graphfed.flower.app`` holds the Flower App (``server_app``, ``client_app``); the server drives the same
round loop as the simulator through :class:`graphfed.flower.server.FlowerExecutor`, and clients run the
same training code (``graphfed.client.executor.ClientRuntime``) with one client per node.
"""
