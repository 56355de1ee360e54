"""Sliding windows larger than the sequences (issue 14): clamped at validation, never overflowing.

``(2**31 - 1, 2**31 - 1)`` gave an all-zero output, ``(W, 0)`` with ``causal=True`` all-zero
gradients (int32 overflow in block ranges), and ``>= 2**31`` an ``OverflowError``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.ops.validate import check_flash_attention_args
from ejk.testing import assert_close, paged_batch, reference_flash_attention, reference_ragged_paged_attention

HUGE = (2**31 - 1, 2**31, 2**40)


def _qkv(seed: int = 0, q_len: int = 24, kv_len: int = 40) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal((2, n, h, 16)), jnp.float32)
                 for n, h in ((q_len, 4), (kv_len, 2), (kv_len, 2)))


def test_validation_clamps_each_side_to_the_sequence_lengths() -> None:
    q, k, v = _qkv()
    common: dict[str, Any] = dict(softmax_scale=None, logits_soft_cap=None, q_segment_ids=None,
                                  kv_segment_ids=None, bias=None)
    for w in HUGE:
        assert check_flash_attention_args(q, k, v, causal=False, sliding_window=(w, w), **common)[1] == (39, 23)
        assert check_flash_attention_args(q, k, v, causal=True, sliding_window=(w, 0), **common)[1] == (39, 0)
    assert check_flash_attention_args(q, k, v, causal=False, sliding_window=(3, 5), **common)[1] == (3, 5)


@pytest.mark.parametrize("w", HUGE)
def test_huge_window_is_the_whole_sequence_forward(w: int) -> None:
    q, k, v = _qkv()
    full = reference_flash_attention(q, k, v)
    out = ejk.flash_attention(q, k, v, sliding_window=(w, w))
    assert_close(out, full, jnp.float32)
    assert float(jnp.abs(out).max()) > 0


@pytest.mark.parametrize("w", HUGE)
def test_huge_causal_window_gives_the_causal_values_and_gradients(w: int) -> None:
    q, k, v = _qkv(1)

    def loss(fn: Any, window: Any) -> Any:
        return lambda q, k, v: (fn(q, k, v, causal=True, sliding_window=window) ** 2).sum()

    got = jax.value_and_grad(loss(ejk.flash_attention, (w, 0)), argnums=(0, 1, 2))(q, k, v)
    want = jax.value_and_grad(loss(reference_flash_attention, None), argnums=(0, 1, 2))(q, k, v)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)  # the loss: one float32 sum
    for g, r in zip(got[1], want[1], strict=True):
        assert float(jnp.abs(g).max()) > 0
        assert_close(g, r, jnp.float32, what="gradient")


@pytest.mark.parametrize("w", HUGE)
def test_huge_window_in_paged_attention_is_the_whole_context(w: int) -> None:
    arrays = paged_batch(2)
    out = ejk.ragged_paged_attention(*arrays, sliding_window=w)
    want = reference_ragged_paged_attention(*arrays)
    assert_close(out, want, jnp.float32, kind="paged")
