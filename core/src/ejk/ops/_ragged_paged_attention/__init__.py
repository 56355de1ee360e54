"""``ragged_paged_attention``: everything about the op in one folder.

``_op`` (the kernel and the public function, declared with ``define_op``), ``_check`` (argument
validation), ``_reference`` (the plain reference), ``_conformance`` (the check every platform's
implementation passes), ``_splits`` (helpers its kernels share), ``_shard`` (how a call splits
over sharded inputs) and ``_bench`` (what ``ejk bench`` measures).
"""

from __future__ import annotations

from ejk.ops._ragged_paged_attention._op import RaggedPagedAttentionKernel, ragged_paged_attention
from ejk.ops._ragged_paged_attention._splits import paged_merge_splits, paged_owned_rows

__all__ = ["RaggedPagedAttentionKernel", "paged_merge_splits", "paged_owned_rows", "ragged_paged_attention"]
