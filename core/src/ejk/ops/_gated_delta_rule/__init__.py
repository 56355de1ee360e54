"""``gated_delta_rule``: everything about the op in one folder.

``_op`` (the kernel and the public function), ``_step`` (the one-token decode form), ``_check``
(argument validation), ``_reference`` (the step-by-step reference), ``_conformance``, ``_shard``,
``_bench`` and ``_samples``.
"""

from __future__ import annotations

from ejk.ops._gated_delta_rule._op import GatedDeltaRuleKernel, gated_delta_rule
from ejk.ops._gated_delta_rule._step import gated_delta_rule_step

__all__ = ["GatedDeltaRuleKernel", "gated_delta_rule", "gated_delta_rule_step"]
