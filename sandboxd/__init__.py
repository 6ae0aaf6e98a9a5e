"""sandboxd: sandbox execution for agentic RL and agent inference."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sandboxd")  # pyproject.toml's, the one place it is written
except PackageNotFoundError:  # pragma: no cover - run from a tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
