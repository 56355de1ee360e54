"""Device fingerprints: the device part of every config-cache key."""

from __future__ import annotations

import functools
import re
from typing import Any

import jax

__all__ = ["device_fingerprint"]


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text.strip()) or "unknown"


@functools.lru_cache(maxsize=64)
def _fingerprint(device: Any, facts: tuple[tuple[str, str], ...]) -> str:
    parts = [_clean(device.platform), _clean(getattr(device, "device_kind", "unknown"))]
    parts += [f"{_clean(k)}={_clean(v)}" for k, v in facts]
    return "|".join(parts)


def device_fingerprint(device: Any | None = None, *, plugin_facts: bool = True) -> str:
    """A stable string naming the kind of ``device`` (default: JAX's first default device).

    It is ``platform|device_kind`` plus the ``ejk_device_fingerprint`` facts of the loaded
    plugins, e.g. ``gpu|NVIDIA_H100_80GB_HBM3|sm=90``. It names a *kind* of device, so two
    processes (or machines) with the same GPU model share tuned configs.
    """
    if device is None:
        device = jax.devices()[0]
    facts: tuple[tuple[str, str], ...] = ()
    if plugin_facts:
        from ejk.plugins import get_plugin_host

        facts = tuple(sorted(get_plugin_host().device_facts(device).items()))
    return _fingerprint(device, facts)
