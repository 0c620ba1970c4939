"""ablate: run ML ablation sweeps across rented GPU instances that share a filesystem."""

__version__ = "0.1.0"
