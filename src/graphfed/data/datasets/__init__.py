"""Dataset builders: each module turns raw data (generated or read from disk) into per-client arrays."""
