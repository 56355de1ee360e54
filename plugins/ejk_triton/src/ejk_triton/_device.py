"""Facts about this machine's NVIDIA GPU that the kernels' gates and configs read.

The facts are ejk's (:data:`ejk.plugin.devices`: Hopper's numbers without a GPU, for ahead-of-time
lowering and the interpreter mode on the CPU), under the names the kernels use; this module adds
ejk-triton's own rules. It imports no toolkit.
"""

from __future__ import annotations

from collections.abc import Callable

from ejk.plugin import devices
from ejk_triton import _env

__all__ = ["compute_capability", "compute_capability_reason", "persistent_programs", "sm_count", "smem_limit",
           "widened_block"]

#: Programs of a persistent kernel in the interpreter (each still walks several items).
_INTERPRETER_PROGRAMS = 3
#: The sequential state kernels' programs per SM before their blocks widen (:func:`widened_block`).
_STATE_PROGRAMS_PER_SM = 1.5

compute_capability = devices.compute_capability
sm_count = devices.sm_count
#: Shared memory per block (bytes) the configs may use.
smem_limit = devices.smem_per_block


def compute_capability_reason() -> str | None:
    """Why this GPU cannot run the kernels (compute capability below 8.0), else ``None``."""
    found = compute_capability()
    if found is None or found[0] >= 8:
        return None
    return f"needs an NVIDIA GPU of compute capability 8.0 or newer (found {found[0]}.{found[1]})"


def persistent_programs(work: int, per_sm: int = 1) -> int:
    """Programs of a persistent kernel over ``work`` items: ``per_sm`` per SM (3 in the interpreter on a
    CPU), never more than the items, at least one."""
    wanted = _INTERPRETER_PROGRAMS if _env.interpreting_on_cpu() else per_sm * sm_count()
    return max(1, min(wanted, work))


def widened_block(block: int, widest: int, programs: Callable[[int], int]) -> int:
    """``block`` doubled (up to ``widest``) while ``programs(block)`` exceeds one and a half programs per SM.

    For the sequential state kernels of the linear recurrences: one program walks every chunk of a sequence,
    so at few sequences narrow blocks are what fill the GPU, while at many sequences and heads they queue in
    waves and each re-reads its chunks' inputs. They ran fastest at about one program per SM, a single wave;
    the slack keeps one sequence's tiles on GPUs of fewer SMs (measured:
    ``benchmarks/results/linear_attention_h100.md`` and ``gated_delta_rule_h100.md``).
    """
    while block < widest and programs(block) > _STATE_PROGRAMS_PER_SM * sm_count():
        block *= 2
    return block
