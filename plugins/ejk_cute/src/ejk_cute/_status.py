"""Whether the CuTe kernels can run here, as the platform's status and as the first words of every gate."""

from __future__ import annotations

from ejk.plugin import PlatformStatus
from ejk_cute import _compile, _device

__all__ = ["platform_status", "runtime_reason"]


def runtime_reason() -> str | None:
    """Why no CuTe kernel can run on this machine (CUTLASS missing, no sm_90+ GPU), else ``None``.

    Every implementation's capability gate starts with this, so ``platform="auto"`` passes the
    call on to another implementation instead of failing; nothing is imported.
    """
    return _compile.cutlass_reason() or _device.arch_reason()


def platform_status() -> PlatformStatus:
    """The ``cute`` platform's :class:`~ejk.plugin.PlatformStatus` on this machine (imports no toolkit)."""

    found = _compile.version()
    versions = {_compile.DISTRIBUTION: found} if found else {}
    if (reason := _compile.cutlass_reason()) is not None:
        return PlatformStatus(platform="cute", available=False, versions=versions,
                              reason=f"{_compile.DISTRIBUTION} not installed ({reason})",
                              fix=f"pip install '{_compile.EXTRA}'")
    if (reason := _device.arch_reason()) is not None:
        return PlatformStatus(platform="cute", available=False, versions=versions, reason=reason,
                              fix="run on an NVIDIA Hopper (H100/H200) or newer GPU; without one, "
                                  "ejk_cute._compile.export_for_cuda compiles the kernels for sm_90a")
    return PlatformStatus(platform="cute", available=True, versions=versions)
