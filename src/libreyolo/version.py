"""The package's version, in a module of its own: the CLI and export read it without importing
the package face (`libreyolo/__init__.py`, which hands out the LibreYOLO facade)."""

__version__ = "0.1.0"  # pyproject.toml's [project] version
