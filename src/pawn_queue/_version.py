"""The version of this package, on its own so that any module may read it."""

__version__ = "0.2.0"
