"""The slobench version: its own module, so that anything below the package's `__init__` can name it
without importing the package's lazy public API."""

__version__ = "0.1.0"
