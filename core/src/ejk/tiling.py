"""Integer helpers for choosing kernel tiles, shared by the plugins' implementations."""

from __future__ import annotations

__all__ = ["cdiv", "fit_block", "next_pow2", "padded_dim"]


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ints."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


def fit_block(block: int, length: int, minimum: int = 16) -> int:
    """``block`` clamped to ``length`` rounded up to a power of two (no wasted work on short
    sequences), never below ``minimum``."""
    return max(minimum, min(block, next_pow2(length)))


def padded_dim(d: int, minimum: int = 16) -> int:
    """A head dim padded to a power of two ``>= minimum`` (kernels mask the padding)."""
    return max(minimum, next_pow2(d))
