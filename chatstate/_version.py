"""The one version number: pyproject.toml reads it (hatch), --version shows it."""

__version__ = "0.3.0.dev0"
