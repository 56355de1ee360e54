"""What one case computes: its inputs, the public op call, and the work (FLOPs or bytes) it does.

Each op's workload lives with the op (its :class:`~ejk.ops.OpDefinition`'s ``bench``; the
work each counts is documented there); :func:`workload_for` builds the one of a case.
"""

from __future__ import annotations

from typing import Any

from ejk.bench._cases import BENCHES, Case
from ejk.ops._workload import MODES, Workload, with_backward

__all__ = ["MODES", "Workload", "with_backward", "workload_for"]


def workload_for(case: Case, dtype: Any) -> Workload:
    """The workload of ``case`` at ``dtype``."""
    return BENCHES[case.op].workload(case=case, dtype=dtype)
