"""The rlinkd version string, from one place.

The installed distribution's metadata is the truth; a source tree that is not
installed (or installed under another name) falls back to ``pyproject.toml``'s
``project.version``; ``"unknown"`` when neither can be read. Used by
``rlinkd --version``, the checkpointer's manifests and ``rlinkd export``.
"""
from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DISTRIBUTION = "rlinkd"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def package_version() -> str:
    """The version of rlinkd this code belongs to (never raises)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return pyproject_version(PYPROJECT)


def pyproject_version(path: Path) -> str:
    """``project.version`` of a pyproject.toml; ``"unknown"`` if it is missing or unreadable."""
    try:
        with open(path, "rb") as fh:
            version = tomllib.load(fh).get("project", {}).get("version")
    except (OSError, tomllib.TOMLDecodeError):
        return "unknown"
    return version if isinstance(version, str) and version else "unknown"
