"""The operations' argument validators, public for plugin authors and their tests.

Each ``check_<op>_args`` raises ``ValueError`` naming the argument, what it got and what it
needs, and returns the normalised static values the implementations receive (for example
flash attention's resolved ``(softmax_scale, sliding_window)``). They accept concrete arrays,
tracers and ``jax.ShapeDtypeStruct``; value checks run only where values are concrete.
"""

from __future__ import annotations

from ejk.ops._flash_attention._check import check_flash_attention_args
from ejk.ops._grouped_matmul._check import check_grouped_matmul_args
from ejk.ops._matmul._check import check_matmul_args
from ejk.ops._ragged_paged_attention._check import check_ragged_paged_attention_args

__all__ = [
    "check_flash_attention_args",
    "check_grouped_matmul_args",
    "check_matmul_args",
    "check_ragged_paged_attention_args",
]
