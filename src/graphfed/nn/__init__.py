"""Server-side networks: GNN encoders (PyG), hypernetworks, graph generators."""
