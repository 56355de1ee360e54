"""Installed distribution versions (cached) for cache provenance and diagnostics."""

from __future__ import annotations

import functools
import importlib.metadata

__all__ = ["core_versions", "installed_version"]

CORE_DISTRIBUTIONS = ("ejk-core", "jax", "jaxlib")


@functools.cache
def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or ``None`` when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def core_versions() -> dict[str, str]:
    """Versions of ejk-core, jax and jaxlib (those installed)."""
    return {name: v for name in CORE_DISTRIBUTIONS if (v := installed_version(name)) is not None}
