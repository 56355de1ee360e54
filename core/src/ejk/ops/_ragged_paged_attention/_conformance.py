"""The conformance check of ``ragged_paged_attention``: decode, chunked prefill, a padded batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from ejk.ops._ragged_paged_attention._op import ragged_paged_attention
from ejk.ops._ragged_paged_attention._reference import reference_ragged_paged_attention
from ejk.testing._cases import paged_batch
from ejk.testing._op_checks import assert_close

__all__ = ["check_ragged_paged_attention"]


def check_ragged_paged_attention(platform: str, *, dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
                                 cfg: Any = None) -> int:
    """``ejk.ragged_paged_attention`` on ``platform``: decode, chunked prefill, a padded batch."""
    pages = 16
    cases: tuple[tuple[list[int], list[int], int, dict[str, Any]], ...] = (  # kv_lens, q_lens, num_seqs, options
        ([9, 5, 16, 1], [1, 1, 1, 1], 4, {}),  # decode
        ([12, 7], [5, 7], 2, {"sliding_window": 4}),  # chunked prefill, a whole prompt
        ([10, 6, 3], [2, 3, 1], 2, {"logits_soft_cap": 10.0}),  # the third sequence is padding
    )
    for seed, dtype in enumerate(dtypes):
        for kv_lens, q_lens, num_seqs, options in cases:
            args = paged_batch(seed, q_lens=q_lens, kv_lens=kv_lens, num_seqs=num_seqs, pages_per_seq=4,
                               spare_pages=pages - 4 * len(kv_lens), hq=8, hkv=2, d=16, dtype=dtype)
            got = ragged_paged_attention(*args, platform=platform, cfg=cfg, **options)
            assert_close(got, reference_ragged_paged_attention(*args, **options), dtype,
                         what=f"ragged_paged_attention[{platform}] kv={kv_lens} q={q_lens} {jnp.dtype(dtype).name}")
    return len(dtypes) * len(cases)
