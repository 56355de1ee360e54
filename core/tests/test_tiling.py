"""ejk.tiling: block helpers and the persistent grid's snake schedule."""

from __future__ import annotations

import numpy as np

from ejk.tiling import cdiv, fit_block, next_pow2, padded_dim, persistent_ctas, snake_owner


def test_block_helpers() -> None:
    assert (cdiv(7, 2), cdiv(8, 2), cdiv(0, 3)) == (4, 4, 0)
    assert (next_pow2(0), next_pow2(1), next_pow2(5), next_pow2(64)) == (1, 1, 8, 64)
    assert fit_block(128, 40) == 64 and fit_block(128, 3) == 16 and fit_block(64, 1000) == 64
    assert padded_dim(80) == 128 and padded_dim(8) == 16


def test_snake_owner_deals_rounds_alternately() -> None:
    assert list(snake_owner(10, 4)) == [0, 1, 2, 3, 3, 2, 1, 0, 0, 1]
    for items, ctas in ((12, 3), (9, 4), (7, 7), (5, 9)):
        owners = snake_owner(items, ctas)
        assert owners.min() >= 0 and owners.max() < ctas
        # CTA c's j-th item is j * ctas + (c if j is even else ctas - 1 - c).
        for c in range(ctas):
            mine = np.flatnonzero(owners == c)
            want = [j * ctas + (c if j % 2 == 0 else ctas - 1 - c) for j in range(len(mine))]
            assert list(mine) == want


def test_persistent_ctas_balances_unequal_items() -> None:
    # 22 causal query blocks of 192 rows over 32 key blocks, 2816 items: 132 CTAs would deal every CTA
    # the same query block in every round (132 = 6 x 22); the chosen count is within 3% of even.
    costs = np.minimum(np.ceil((np.arange(22, 0, -1) * 192) / 128), 32) + 1
    items = 22 * 128
    ctas = persistent_ctas(132, items, costs)
    assert 120 <= ctas < 132
    work = np.bincount(snake_owner(items, ctas), weights=np.resize(costs, items))
    assert work.max() <= 1.03 * work.sum() / ctas
    strided = np.bincount(np.arange(items) % 132, weights=np.resize(costs, items))
    assert strided.max() > 1.5 * strided.mean()  # what the search avoids


def test_persistent_ctas_equal_or_few_items() -> None:
    assert persistent_ctas(132, 2048, [5] * 32) == 132  # equal work: every SM
    assert persistent_ctas(132, 100, [9, 1]) == 100  # fewer items than SMs: one each
    assert persistent_ctas(132, 0, [1]) == 1
