"""``flash_attention_varlen``: everything about the op in one folder.

``_op`` (the kernel and the public function, declared with ``define_op``), ``_check`` (argument
validation), ``_ranges`` (the key interval of each packed row, which the implementations share),
``_reference`` (the plain reference), ``_conformance`` (the check every platform's implementation
passes), ``_shard`` (how a call splits over sharded inputs) and ``_bench`` (what ``ejk bench`` measures).
"""

from __future__ import annotations

from ejk.ops._flash_attention_varlen._op import FlashAttentionVarlenKernel, flash_attention_varlen
from ejk.ops._flash_attention_varlen._ranges import sanitize_offsets, varlen_row_ranges

__all__ = ["FlashAttentionVarlenKernel", "flash_attention_varlen", "sanitize_offsets", "varlen_row_ranges"]
