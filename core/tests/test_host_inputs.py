"""Values given on the host (Python lists, NumPy arrays) are validated before JAX converts them
(issue 28): integers that would wrap to int32 and NumPy float64 are refused by every op, naming the
argument and the fix, and every op takes Python lists for its arrays."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejk.ops import FlashAttentionKernel, GroupedMatmulKernel, MatmulKernel, RaggedPagedAttentionKernel
from ejk.testing import paged_batch

FLOAT64 = r"has dtype float64 but needs a floating dtype: .*\(float64 is not supported: cast to float32\)"


@pytest.mark.parametrize("group_sizes", [[2**32 + 1, 0], np.array([2**32 + 1, 0]), np.array([0, -(2**31) - 1])])
def test_group_sizes_that_would_wrap_to_int32_are_refused(group_sizes: Any) -> None:
    with pytest.raises(ValueError, match=r"grouped_matmul: group_sizes holds -?\d+, which does not fit int32 .*"
                                         r"jax_enable_x64"):
        GroupedMatmulKernel().normalize(jnp.ones((4, 8)), jnp.ones((2, 8, 4)), group_sizes)


def test_kv_lens_and_num_seqs_that_would_wrap_are_refused() -> None:
    q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs = paged_batch()
    wrapped = np.asarray(kv_lens, np.int64)
    wrapped[0] += 2**32  # 2**32 + 9 would run as 9
    with pytest.raises(ValueError, match=r"ragged_paged_attention: kv_lens holds 4294967305, which does not fit"):
        RaggedPagedAttentionKernel().normalize(q, k_pages, v_pages, wrapped, page_indices, cu_q_lens, num_seqs)
    with pytest.raises(ValueError, match=r"ragged_paged_attention: num_seqs is np.int64.4294967299. but needs a "
                                         r"value that fits int32"):
        RaggedPagedAttentionKernel().normalize(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens,
                                               np.int64(2**32 + 3))


def test_float64_is_refused_the_same_way_by_every_op() -> None:
    x = np.ones((1, 4, 2, 8))
    with pytest.raises(ValueError, match="matmul: a " + FLOAT64):
        MatmulKernel().normalize(np.ones((4, 4)), np.ones((4, 4), np.float32))
    with pytest.raises(ValueError, match="flash_attention: q " + FLOAT64):
        FlashAttentionKernel().normalize(x, x, x)
    with pytest.raises(ValueError, match="grouped_matmul: rhs " + FLOAT64):
        GroupedMatmulKernel().normalize(jnp.ones((4, 8)), np.ones((2, 8, 4)), jnp.array([2, 2]))


def test_every_op_takes_python_lists() -> None:
    q = np.ones((1, 4, 2, 8), np.float32).tolist()
    (q_, k_, v_, *_), _ = FlashAttentionKernel().normalize(q, q, q, q_segment_ids=[[0, 0, 1, 1]],
                                                           kv_segment_ids=[[0, 0, 1, 1]])
    assert all(x.shape == (1, 4, 2, 8) and x.dtype == jnp.float32 for x in (q_, k_, v_))
    (a, b), _ = MatmulKernel().normalize([[1.0, 2.0]], [[1.0], [2.0]])
    assert (a.shape, b.shape, a.dtype) == ((1, 2), (2, 1), jnp.float32)
    (lhs, _, sizes), _ = GroupedMatmulKernel().normalize(np.ones((4, 8), np.float32).tolist(), jnp.ones((2, 8, 4)),
                                                         [2, 2])
    assert (lhs.shape, sizes.dtype) == ((4, 8), jnp.int32)
    assert not jax.config.jax_enable_x64
