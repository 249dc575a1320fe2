"""The package's version, in a module of its own so that any layer can name it without importing the package root."""

__all__ = ["VERSION"]

VERSION = "0.1.0"  # keep equal to [project] version in pyproject.toml
