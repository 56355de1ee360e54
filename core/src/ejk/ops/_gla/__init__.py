"""``gla``: gated linear attention, everything about the op in one folder.

``_op`` (the kernel and the public function), ``_step`` (``gla_step``, one decode token),
``_check`` (argument validation, shared with ``ssd``: packed sequences and states), ``_reference``
(the step-by-step reference), ``_conformance``, ``_bench`` and ``_samples``.
"""

from __future__ import annotations

from ejk.ops._gla._op import GLA_RESIDUALS, GlaKernel, gla
from ejk.ops._gla._step import gla_step

__all__ = ["GLA_RESIDUALS", "GlaKernel", "gla", "gla_step"]
