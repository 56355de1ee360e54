"""``flash_attention`` (and ``flash_attention_lse``): everything about the op in one folder.

- ``_op``: the kernel and the public function, declared with ``define_op``; ``_lse``: the
  variant that also returns each row's log-sum-exp;
- ``_check``: argument validation; ``_reference``: the plain reference; ``_conformance``: the
  check every platform's implementation passes;
- ``_residuals``: the residual format the flash kernels share; ``_shard``: how a call splits
  over sharded inputs; ``_bench``: what ``ejk bench`` measures.
"""

from __future__ import annotations

from ejk.ops._flash_attention._lse import FlashAttentionLseKernel, flash_attention_lse
from ejk.ops._flash_attention._op import FlashAttentionKernel, flash_attention, flash_attention_call

__all__ = ["FlashAttentionKernel", "FlashAttentionLseKernel", "flash_attention", "flash_attention_call",
           "flash_attention_lse"]
