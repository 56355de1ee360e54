"""One rule per input across the ops (issues 6 and 14): softmax_scale, dtypes (no float64),
array-likes, num_seqs; and ragged paged attention propagates NaN like flash attention."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import assert_close, paged_batch, reference_ragged_paged_attention


def _qkv() -> tuple[jax.Array, jax.Array, jax.Array]:
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 8, 2, 16)), jnp.float32)
    return x, x, x


# -- softmax_scale: one rule ------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [-1.0, 0.0, math.inf, math.nan, "0.1", True])
def test_softmax_scale_has_one_rule_for_every_op(scale: Any) -> None:
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"flash_attention: softmax_scale is .* but needs a finite number > 0"):
        ejk.flash_attention(q, k, v, softmax_scale=scale)
    with pytest.raises(ValueError, match=r"ragged_paged_attention: softmax_scale is .* needs a finite number > 0"):
        ejk.ragged_paged_attention(*paged_batch(), softmax_scale=scale)


def test_positive_scales_pass_everywhere() -> None:
    q, k, v = _qkv()
    assert ejk.flash_attention(q, k, v, softmax_scale=0.5).shape == q.shape
    assert ejk.ragged_paged_attention(*paged_batch(), softmax_scale=0.5).shape == (9, 4, 16)


# -- dtypes: float64 is rejected by every op ---------------------------------------------------------


def test_float64_is_rejected_by_every_op_with_the_fix() -> None:
    with jax.enable_x64(True):
        a = jnp.ones((4, 4), jnp.float64)
        needs = (r"needs a floating dtype: one of bfloat16, float16, float32 "
                 r"\(float64 is not supported: cast to float32\)")
        with pytest.raises(ValueError, match=rf"matmul: a has dtype float64 but {needs}"):
            ejk.matmul(a, a)
        with pytest.raises(ValueError, match=rf"grouped_matmul: lhs has dtype float64 but {needs}"):
            ejk.grouped_matmul(a, a[None], jnp.array([4], jnp.int32))
        q = jnp.ones((1, 4, 2, 8), jnp.float64)
        with pytest.raises(ValueError, match=rf"flash_attention: q has dtype float64 but {needs}"):
            ejk.flash_attention(q, q, q)
        arrays = paged_batch()
        arrays[0] = arrays[0].astype(jnp.float64)
        with pytest.raises(ValueError, match=rf"ragged_paged_attention: q has dtype float64 but {needs}"):
            ejk.ragged_paged_attention(*arrays)


# -- array-likes and num_seqs -----------------------------------------------------------------------


def test_python_lists_are_converted_like_jnp_asarray() -> None:
    arrays = paged_batch()
    want = ejk.ragged_paged_attention(*arrays)
    as_lists = [*arrays[:3], *(np.asarray(x).tolist() for x in arrays[3:6]), arrays[6]]
    got = ejk.ragged_paged_attention(*as_lists)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    a = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(np.asarray(ejk.matmul(a.tolist(), np.ones((4, 2), np.float32))), 4.0)
    out = ejk.grouped_matmul(a, np.ones((2, 4, 2), np.float32), [1, 2])
    np.testing.assert_allclose(np.asarray(out), 4.0)


def test_ragged_lists_are_rejected_clearly() -> None:
    arrays = paged_batch()
    arrays[4] = [[0, 1, 2], [3, 4], [5, 6, 7]]
    with pytest.raises(ValueError, match=r"ragged_paged_attention: page_indices is .* but needs an array"):
        ejk.ragged_paged_attention(*arrays)


@pytest.mark.parametrize("num_seqs", [1.7, "2", True, np.float32(2.0), None, jnp.array(2.0)])
def test_num_seqs_is_never_truncated(num_seqs: Any) -> None:
    arrays = paged_batch()
    with pytest.raises(ValueError, match=r"ragged_paged_attention: num_seqs is .* but needs an int"):
        ejk.ragged_paged_attention(*arrays[:6], num_seqs)


@pytest.mark.parametrize("num_seqs", [2, np.int64(2), jnp.array(2), jnp.array([2])])
def test_integer_num_seqs_are_accepted(num_seqs: Any) -> None:
    arrays = paged_batch()
    want = reference_ragged_paged_attention(*arrays[:6], 2)
    got = ejk.ragged_paged_attention(*arrays[:6], num_seqs)
    assert_close(got, want, jnp.float32, kind="paged")


# -- NaN propagation --------------------------------------------------------------------------------


def test_nan_in_q_or_a_visible_key_propagates_like_flash_attention() -> None:
    arrays = paged_batch()
    q, k_pages, table = arrays[0], arrays[1], np.asarray(arrays[4])
    arrays[0] = q.at[1, 0, 0].set(jnp.nan)  # sequence 0's second query, head 0
    # The first key of sequence 2 (rows 4..8): visible to all of its queries (no window).
    arrays[1] = k_pages.at[int(table[2, 0]), 0, 1, 0].set(jnp.nan)  # kv head 1 -> q heads 2, 3
    for platform in ("auto", "xla"):
        out = np.asarray(ejk.ragged_paged_attention(*arrays, platform=platform))
        assert np.isnan(out[1, 0]).all() and not np.isnan(out[1, 1:]).any()
        assert np.isnan(out[4:9, 2:]).all() and not np.isnan(out[4:9, :2]).any()
        assert not np.isnan(out[[0, 2, 3]]).any()  # other rows: untouched
    ref = np.asarray(reference_ragged_paged_attention(*arrays))
    np.testing.assert_array_equal(np.isnan(ref), np.isnan(out))


def test_nan_in_an_invisible_key_does_not_leak() -> None:
    arrays = paged_batch()
    table = np.asarray(arrays[4])
    # Sequence 1 has 4 keys (one page): its second page slot holds garbage it never sees.
    arrays[1] = arrays[1].at[int(table[1, 1])].set(jnp.nan)
    arrays[2] = arrays[2].at[int(table[1, 1])].set(jnp.nan)
    out = np.asarray(ejk.ragged_paged_attention(*arrays[:4], table, *arrays[5:]))
    assert not np.isnan(out[3]).any()
