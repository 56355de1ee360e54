"""``ssd``: the Mamba-2 state-space dual, everything about the op in one folder.

``_op`` (the kernel and the public function), ``_step`` (``ssd_step``, one decode token),
``_check`` (argument validation), ``_reference`` (the step-by-step reference), ``_conformance``,
``_bench`` and ``_samples``.
"""

from __future__ import annotations

from ejk.ops._ssd._op import SSD_RESIDUALS, SsdKernel, ssd
from ejk.ops._ssd._step import ssd_step

__all__ = ["SSD_RESIDUALS", "SsdKernel", "ssd", "ssd_step"]
