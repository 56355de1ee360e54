"""``rms_norm``: everything about the op in one folder.

``_op`` (the kernel and the public function), ``_check`` (argument validation), ``_reference``
(the plain reference), ``_conformance`` (the check every platform's implementation passes),
``_shard`` (row-parallel calls) and ``_bench`` (what ``ejk bench`` measures).
"""

from __future__ import annotations

from ejk.ops._rms_norm._op import RMS_NORM_RESIDUALS, RmsNormKernel, rms_norm

__all__ = ["RMS_NORM_RESIDUALS", "RmsNormKernel", "rms_norm"]
