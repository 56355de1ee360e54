"""Where a benchmark ran: device, driver, CUDA, versions of everything that matters, date."""

from __future__ import annotations

import datetime
import platform
import shutil
import subprocess
import warnings
from typing import Any

import jax

from ejk._versions import installed_version

__all__ = ["environment"]

#: Distributions whose versions are recorded when installed (besides every ejk plugin's).
DISTRIBUTIONS = (
    "ejk-core", "jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt",
    "triton", "jax-triton", "nvidia-cutlass-dsl", "numpy",
)


def _driver() -> str | None:
    """The NVIDIA driver version from ``nvidia-smi`` (``None`` when it cannot be asked)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def _plugin_versions() -> dict[str, str]:
    from ejk.plugins import get_plugin_host

    versions: dict[str, str] = {}
    with warnings.catch_warnings():  # a broken plugin is reported by `ejk plugins`, not here
        warnings.simplefilter("ignore")
        host = get_plugin_host()
        for info in host.plugins.values():
            if info.distribution and info.version:
                versions[info.distribution] = info.version
        for status in host.platform_statuses().values():
            versions.update({k: str(v) for k, v in dict(status.versions).items() if v})
    return versions


def environment() -> dict[str, Any]:
    """Device kind and count, backend, CUDA (the runtime's platform version), driver, host, Python,
    the versions of jax, jaxlib, ejk, its plugins and their toolkits, and the UTC date."""
    device = jax.devices()[0]
    client = getattr(device, "client", None)
    versions = {name: v for name in DISTRIBUTIONS if (v := installed_version(name)) is not None}
    versions.update(_plugin_versions())
    backend = jax.default_backend()
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "backend": backend,
        "device_kind": getattr(device, "device_kind", device.platform),
        "device_count": jax.device_count(),
        "platform_version": getattr(client, "platform_version", None),
        "driver": _driver() if backend == "gpu" else None,
        "host": platform.node() or None,
        "python": platform.python_version(),
        "versions": dict(sorted(versions.items())),
    }
