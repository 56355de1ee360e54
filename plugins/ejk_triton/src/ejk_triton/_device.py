"""Facts about this machine's NVIDIA GPU that the kernels' gates and configs read.

Every function answers without a GPU too (Hopper's values, for ahead-of-time lowering and the
interpreter mode on the CPU), and imports no toolkit.
"""

from __future__ import annotations

from typing import Any

import jax

from ejk_triton import _env

__all__ = ["SMEM_KIB", "compute_capability", "compute_capability_reason", "persistent_programs", "sm_count",
           "smem_limit"]

#: Shared memory a block may use (KiB) by compute capability (the driver's opt-in maximum);
#: configs whose tiles need more are not proposed. Others: 99 KiB.
SMEM_KIB = {(8, 0): 163, (8, 7): 163, (9, 0): 227, (10, 0): 227, (10, 3): 227}
_HOPPER_SMEM = 227 * 1024
#: Streaming multiprocessors of an H100 SXM: the persistent kernels' program count without a GPU.
_HOPPER_SMS = 132
#: Programs of a persistent kernel in the interpreter (each still walks several items).
_INTERPRETER_PROGRAMS = 3


def _device() -> Any:
    return jax.devices()[0]


def compute_capability() -> tuple[int, int] | None:
    """``(major, minor)`` of JAX's default device when it is an NVIDIA GPU that reports one, else ``None``."""
    if not _env.nvidia_gpu()[0]:
        return None
    raw = str(getattr(_device(), "compute_capability", "") or "")
    try:
        major, minor = (int(x) for x in raw.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def compute_capability_reason() -> str | None:
    """Why this GPU cannot run the kernels (compute capability below 8.0), else ``None``."""
    found = compute_capability()
    if found is None or found[0] >= 8:
        return None
    return f"needs an NVIDIA GPU of compute capability 8.0 or newer (found {found[0]}.{found[1]})"


def smem_limit() -> int:
    """Shared memory per block (bytes) on this machine's GPU; Hopper's when there is none (AOT, CPU)."""
    found = compute_capability()
    if found is None:
        return _HOPPER_SMEM
    return SMEM_KIB.get(found, 99) * 1024


def sm_count() -> int:
    """Streaming multiprocessors of this machine's GPU; an H100's 132 when there is none or it does not say."""
    if not _env.nvidia_gpu()[0]:
        return _HOPPER_SMS
    count = getattr(_device(), "core_count", None)
    return int(count) if isinstance(count, int) and count > 0 else _HOPPER_SMS


def persistent_programs(work: int, per_sm: int = 1) -> int:
    """Programs of a persistent kernel over ``work`` items: ``per_sm`` per SM (3 in the interpreter on a
    CPU), never more than the items, at least one."""
    wanted = _INTERPRETER_PROGRAMS if _env.interpreting_on_cpu() else per_sm * sm_count()
    return max(1, min(wanted, work))
