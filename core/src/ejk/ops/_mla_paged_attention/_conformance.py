"""The conformance check of ``mla_paged_attention``, and the batches its tests build."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._mla_paged_attention._op import mla_paged_attention
from ejk.ops._mla_paged_attention._reference import reference_mla_paged_attention
from ejk.testing._op_checks import assert_close

__all__ = ["check_mla_paged_attention", "mla_batch"]


def mla_batch(
    seed: int = 0,
    *,
    kv_lens: Sequence[int] = (9, 1, 12),
    sq: int = 1,
    hq: int = 8,
    dk: int = 80,
    page: int = 4,
    pages_per_seq: int | None = None,
    spare_pages: int = 2,
    dtype: Any = jnp.float32,
) -> list[Any]:
    """The positional arguments of ``mla_paged_attention``: sequences over shuffled pages.

    Each sequence owns ``pages_per_seq`` pages (default: the fewest its longest context needs, at
    least 1) of a cache of ``B * pages_per_seq + spare_pages`` pages, in random order; the entries of
    a row past the pages its context uses hold out-of-range garbage (they are never read).

    Returns:
        ``[q, kv_pages, kv_lens, page_indices]``.
    """
    rng = np.random.default_rng(seed)
    batch = len(kv_lens)
    per_seq = pages_per_seq or max(1, *(-(-n // page) for n in kv_lens))
    pages = batch * per_seq + spare_pages
    table = rng.permutation(pages)[: batch * per_seq].reshape(batch, per_seq)
    for b, n in enumerate(kv_lens):
        used = -(-n // page)
        table[b, used:] = rng.integers(-3, pages + 3, size=per_seq - used)
    return [jnp.asarray(rng.standard_normal((batch, sq, hq, dk)), dtype),
            jnp.asarray(rng.standard_normal((pages, page, dk)), dtype),
            jnp.asarray(kv_lens, jnp.int32), jnp.asarray(table, jnp.int32)]


#: ``(kv_lens, sq, options)``: decode, multi-token prediction (causal and not), empty and short contexts.
MLA_CASES: tuple[tuple[tuple[int, ...], int, dict[str, Any]], ...] = (
    ((9, 1, 16, 6), 1, {}),
    ((11, 0, 2, 7), 3, {}),  # kv_len 0 and kv_len < Sq: rows that see nothing are zeros
    ((5, 13), 2, {"causal": False, "softmax_scale": 0.3}),
)


def check_mla_paged_attention(platform: str, *, dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
                              cfg: Any = None) -> int:
    """``ejk.mla_paged_attention`` on ``platform``: decode, causal multi-token prediction, edges."""
    for seed, dtype in enumerate(dtypes):
        for kv_lens, sq, options in MLA_CASES:
            args = mla_batch(seed, kv_lens=kv_lens, sq=sq, hq=8, dk=80, dtype=dtype)
            got = jax.block_until_ready(mla_paged_attention(*args, v_head_dim=64, platform=platform, cfg=cfg,
                                                            **options))
            want = reference_mla_paged_attention(*args, v_head_dim=64, **options)
            assert_close(got, want, dtype, strict=True,
                         what=f"mla_paged_attention[{platform}] kv={kv_lens} sq={sq} {options} "
                              f"{jnp.dtype(dtype).name}")
    return len(dtypes) * len(MLA_CASES)
