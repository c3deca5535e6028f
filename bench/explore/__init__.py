"""One-off GPU explorations, run from the repository root as ``python -m bench.explore.NAME``."""
