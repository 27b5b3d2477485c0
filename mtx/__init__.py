"""mtx: train Transformer translation models end to end."""

__version__ = "0.1.0"
