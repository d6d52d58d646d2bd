"""The benchmarks: see bench/README.md. Run each from the repository root as a module."""
