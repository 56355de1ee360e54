"""One rule per argument across the ops' validators (issue 6): softmax_scale, sliding windows, dtypes.

The validators run on ``jax.ShapeDtypeStruct``s here: no plugin is needed. The same rules end to
end, through the public ops, are in ejk-xla's tests/test_input_rules.py.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejk.ops.validate import (
    check_flash_attention_args,
    check_grouped_matmul_args,
    check_matmul_args,
    check_ragged_paged_attention_args,
)

F32 = jnp.float32


def _sds(shape: tuple[int, ...], dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def flash(**options: Any) -> tuple[float, tuple[int, int] | None]:
    """``check_flash_attention_args`` on q [1, 8, 2, 16], k / v [1, 12, 2, 16] (head dim 16)."""
    q, kv = _sds((1, 8, 2, 16)), _sds((1, 12, 2, 16))
    user = {"causal": False, "softmax_scale": None, "sliding_window": None, "logits_soft_cap": None,
            "q_segment_ids": None, "kv_segment_ids": None, "bias": None, **options}
    return check_flash_attention_args(q, kv, kv, **user)


def paged(**options: Any) -> tuple[float, tuple[int, int] | None]:
    """``check_ragged_paged_attention_args`` on two sequences over 4 pages of 8 (head dim 16)."""
    q = options.pop("q", _sds((5, 2, 16)))  # before `user`: q is not an option
    pages = _sds((4, 8, 2, 16))
    i32 = jnp.int32
    user = {"softmax_scale": None, "sliding_window": None, "logits_soft_cap": None, **options}
    return check_ragged_paged_attention_args(q, pages, pages, _sds((2,), i32), _sds((2, 2), i32), _sds((3,), i32),
                                             _sds((), i32), **user)


@pytest.mark.parametrize("scale", [-1.0, 0.0, -0.0, math.inf, -math.inf, math.nan, "0.1", True, 1j])
def test_softmax_scale_is_rejected_alike_by_flash_and_paged_attention(scale: Any) -> None:
    messages = []
    for op, check in (("flash_attention", flash), ("ragged_paged_attention", paged)):
        with pytest.raises(ValueError, match=rf"^{op}: softmax_scale is .* but needs a finite number > 0") as info:
            check(softmax_scale=scale)
        messages.append(str(info.value).removeprefix(f"{op}: "))
    assert messages[0] == messages[1]  # one rule, one message


@pytest.mark.parametrize("scale", [None, 0.25, 3])
def test_softmax_scale_resolves_alike(scale: Any) -> None:
    want = 0.25 if scale is None else float(scale)  # None: 1 / sqrt(head_dim = 16)
    assert flash(softmax_scale=scale)[0] == paged(softmax_scale=scale)[0] == want


@pytest.mark.parametrize("window", [-1, (2,), (1, 2, 3), (1, -2), 1.5, "3", True, (True, 1), (1.0, 2)])
def test_bad_windows_are_rejected_alike(window: Any) -> None:
    messages = []
    for op, check in (("flash_attention", flash), ("ragged_paged_attention", paged)):
        with pytest.raises(ValueError, match=rf"^{op}: sliding_window is .* but needs non-negative ints") as info:
            check(sliding_window=window)
        messages.append(str(info.value).removeprefix(f"{op}: "))
    assert messages[0] == messages[1]


def test_causal_window_drops_the_right_side_in_both_ops() -> None:
    """Documented (``ejk.flash_attention``'s docstring): with causal attention ``(l, r)`` means
    ``(l, 0)``; ragged paged attention is always causal, so it does the same."""
    assert flash(causal=True, sliding_window=(3, 7))[1] == (3, 0)
    assert paged(sliding_window=(3, 7))[1] == (3, 0)
    assert flash(causal=True, sliding_window=3)[1] == paged(sliding_window=3)[1] == (3, 0)
    assert flash(causal=False, sliding_window=(3, 7))[1] == (3, 7)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.int32, jnp.bool_])
def test_one_floating_dtype_rule_for_every_op(dtype: Any) -> None:
    name = jnp.dtype(dtype).name
    needs = r"needs a floating dtype: one of bfloat16, float16, float32"
    with pytest.raises(ValueError, match=rf"flash_attention: q has dtype {name} but {needs}"):
        check_flash_attention_args(_sds((1, 8, 2, 16), dtype), _sds((1, 8, 2, 16), dtype), _sds((1, 8, 2, 16), dtype),
                                   causal=False, softmax_scale=None, sliding_window=None, logits_soft_cap=None,
                                   q_segment_ids=None, kv_segment_ids=None, bias=None)
    with pytest.raises(ValueError, match=rf"ragged_paged_attention: q has dtype {name} but {needs}"):
        paged(q=_sds((5, 2, 16), dtype))
    with pytest.raises(ValueError, match=rf"matmul: a has dtype {name} but {needs}"):
        check_matmul_args(_sds((4, 4), dtype), _sds((4, 4)))
    with pytest.raises(ValueError, match=rf"grouped_matmul: lhs has dtype {name} but {needs}"):
        check_grouped_matmul_args(_sds((4, 4), dtype), _sds((1, 4, 4)), _sds((1,), jnp.int32))


@pytest.mark.parametrize(("cu_q_lens", "num_seqs", "owned"), [
    ([0, 2, 3, 5], 3, [1, 1, 1, 1, 1, 0]),  # a trailing padding row
    ([1, 2, 4, 5], 2, [0, 1, 1, 1, 0, 0]),  # rows before the first sequence and of a dead one
    ([0, 2, 3, 5], 0, [0, 0, 0, 0, 0, 0]),  # no live sequence
    ([0, 2, 9, 9], 7, [1, 1, 1, 1, 1, 1]),  # out-of-range lengths and count are clipped
])
def test_paged_owned_rows(cu_q_lens: list[int], num_seqs: int, owned: list[int]) -> None:
    from ejk.ops import paged_owned_rows

    got = paged_owned_rows(6, jnp.asarray(cu_q_lens, jnp.int32), jnp.int32(num_seqs))
    assert got.tolist() == [bool(x) for x in owned]


def test_paged_merge_splits_equals_one_softmax_over_every_split() -> None:
    from ejk.ops import paged_merge_splits

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 8)).astype(np.float32)  # 3 rows, 8 keys (base-2 logits)
    logits[2] = -np.inf  # a row that sees no key
    values = rng.standard_normal((8, 4)).astype(np.float32)
    parts = [(0, 3), (3, 3), (3, 8)]  # the middle split is empty
    acc, row_max, row_sum = [], [], []
    for lo, hi in parts:
        s = logits[:, lo:hi]
        m = s.max(axis=1, initial=-np.inf)
        p = np.exp2(s - np.where(m == -np.inf, 0.0, m)[:, None])
        acc.append(p @ values[lo:hi])
        row_max.append(m)
        row_sum.append(p.sum(axis=1))
    got = np.asarray(paged_merge_splits(jnp.asarray(np.stack(acc)), jnp.asarray(np.stack(row_max)),
                                        jnp.asarray(np.stack(row_sum))))
    p = np.exp2(logits[:2] - logits[:2].max(axis=1, keepdims=True))
    np.testing.assert_allclose(got[:2], (p / p.sum(axis=1, keepdims=True)) @ values, rtol=1e-5, atol=1e-6)
    assert not got[2].any()  # no key in any split: zeros
    nan_sum = np.stack(row_sum)
    nan_sum[1, 0] = np.nan
    got = np.asarray(paged_merge_splits(jnp.asarray(np.stack(acc)), jnp.asarray(np.stack(row_max)),
                                        jnp.asarray(nan_sum)))
    assert np.isnan(got[0]).all() and np.isfinite(got[1]).all()  # NaN propagates to its row only


def test_values_and_grads_takes_one_cotangent_per_seed() -> None:
    """``ejk.testing.values_and_grads``: the output and ``vjp(cotangent)``; a seed fixes the cotangent, so two
    functions computing the same thing give the same gradients."""
    from ejk.testing import values_and_grads

    a = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
    b = jnp.ones((3, 2), jnp.float32)
    out, (da, db) = values_and_grads(lambda x, y: x @ y, (a, b))
    _, (da2, db2) = values_and_grads(lambda x, y: jnp.einsum("ik,kj->ij", x, y), (a, b))
    np.testing.assert_allclose(out, a @ b)
    np.testing.assert_allclose(da, da2, rtol=1e-6)
    np.testing.assert_allclose(db, db2, rtol=1e-6)
    cot = jnp.ones((2, 2), jnp.float32)
    _, (da3, _) = values_and_grads(lambda x, y: x @ y, (a, b), cotangent=cot)
    np.testing.assert_allclose(da3, cot @ b.T)
