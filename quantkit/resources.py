"""Where the shipped data folders are: installed as packages (``quantkit.recipes``, ``quantkit.calibration``,
mapped from the repository's ``recipes/`` and ``calibration/`` by pyproject.toml), or, when quantkit runs from a
source checkout that was never installed (``PYTHONPATH=.``), the repository folders themselves."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def shipped_dir(package: str, repo_folder: str):
    """A Traversable for the shipped folder ``package`` (e.g. quantkit.recipes ↔ recipes/)."""
    try:
        return resources.files(package)
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / repo_folder
