"""Integer helpers for choosing kernel tiles, shared by the plugins' implementations."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["cdiv", "fit_block", "next_pow2", "padded_dim", "persistent_ctas", "snake_owner"]


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


def snake_owner(items: int, ctas: int) -> np.ndarray:
    """The CTA of each of ``items`` work items dealt in a snake: round ``r`` gives items ``r * ctas ..``
    to CTAs ``0 .. ctas - 1``, every other round in reverse. CTA ``c``'s ``j``-th item is
    ``j * ctas + (c if j is even else ctas - 1 - c)``; kernels compute that on the device."""
    i = np.arange(items)
    slot = i % ctas
    return np.where((i // ctas) % 2 == 0, slot, ctas - 1 - slot)


def persistent_ctas(sms: int, items: int, costs: Sequence[int] | np.ndarray, *, search: int = 12) -> int:
    """The CTA count of a persistent grid whose CTAs take work items in a snake (:func:`snake_owner`).

    Item ``i`` costs ``costs[i % len(costs)]`` (kernels that vary query blocks fastest: one cost per
    query block, causal masks making them unequal). Of ``sms - search .. sms`` CTAs, the count whose
    busiest CTA has the least work wins, the largest on ties. Counts that share a large factor with
    ``len(costs)`` deal each CTA the same query blocks every round, which the snake alone does not
    cure: 22 causal query blocks on 132 CTAs give each CTA one of them. Equal costs: ``min(sms, items)``.
    """
    cost = np.asarray(costs, dtype=np.float64)
    if items <= sms or cost.min() == cost.max():
        return max(1, min(sms, items))
    per_item = np.resize(cost, items)
    best, best_span = sms, np.inf
    for ctas in range(sms, max(sms - search, 1) - 1, -1):
        span = float(np.bincount(snake_owner(items, ctas), weights=per_item).max())
        if span < best_span:
            best, best_span = ctas, span
    return best
