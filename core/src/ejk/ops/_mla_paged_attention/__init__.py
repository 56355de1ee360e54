"""``mla_paged_attention``: everything about the op in one folder.

``_op`` (the kernel and the public function, declared with ``define_op``), ``_check`` (argument
validation), ``_reference`` (the float64 reference), ``_conformance`` (the check every platform's
implementation passes), ``_shard`` (how a call splits over sharded inputs), ``_bench`` (what
``ejk bench`` measures) and ``_samples`` (the sample calls).
"""

from __future__ import annotations

from ejk.ops._mla_paged_attention._op import MlaPagedAttentionKernel, mla_paged_attention

__all__ = ["MlaPagedAttentionKernel", "mla_paged_attention"]
