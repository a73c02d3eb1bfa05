"""Engine-agnostic building blocks: parameter views, the hypergradient, seeded random streams."""
