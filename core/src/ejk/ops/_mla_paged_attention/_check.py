"""Validation of ``mla_paged_attention`` arguments; lengths and page tables are checked where concrete."""

from __future__ import annotations

from typing import Any

import numpy as np

from ejk.ops._check_arrays import concrete, listed, require_floating, require_integer, require_ndim
from ejk.ops._check_common import is_int
from ejk.ops._check_common import softmax_scale as resolve_scale

__all__ = ["check_mla_paged_attention_args", "check_mla_paged_attention_values"]

_OP = "mla_paged_attention"


def _check_shapes(q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any) -> None:
    batch, sq, hq, dk = require_ndim(_OP, "q", q, 4, "[B, Sq, Hq, Dk]")
    if dk < 1:
        raise ValueError(f"{_OP}: q has shape {(batch, sq, hq, dk)} but needs [B, Sq, Hq, Dk] with Dk >= 1")
    kv_shape = require_ndim(_OP, "kv_pages", kv_pages, 3, f"[P, page, Dk={dk}]")
    pages, page, kd = kv_shape
    if kd != dk or pages < 1 or page < 1:
        raise ValueError(
            f"{_OP}: kv_pages has shape {kv_shape} but needs [P, page, Dk={dk}] with P and page at least 1 "
            f"(one latent head per position, its last dim that of q, shape {(batch, sq, hq, dk)})"
        )
    lens_shape = require_ndim(_OP, "kv_lens", kv_lens, 1, f"[B={batch}]")
    if lens_shape[0] != batch:
        raise ValueError(f"{_OP}: kv_lens has shape {lens_shape} but needs [B={batch}] (one length per sequence of q)")
    table_shape = require_ndim(_OP, "page_indices", page_indices, 2, f"[B={batch}, pages_per_seq]")
    if table_shape[0] != batch:
        raise ValueError(
            f"{_OP}: page_indices has shape {table_shape} but needs [B={batch}, pages_per_seq] "
            "(one row per sequence of q)"
        )
    for name, x in (("q", q), ("kv_pages", kv_pages)):
        require_floating(_OP, name, x)
    for name, x in (("kv_lens", kv_lens), ("page_indices", page_indices)):
        require_integer(_OP, name, x)


def _check_values(kv_lens: Any, page_indices: Any, pages: int, page: int) -> None:
    """Where concrete: ``0 <= kv_lens <= pages_per_seq * page``, the pages in use in ``[0, P)``."""
    pages_per_seq = page_indices.shape[1]
    lens, table = concrete(kv_lens), concrete(page_indices)
    if lens is not None:
        lens = lens.astype(np.int64)
        (negative,) = np.nonzero(lens < 0)
        if negative.size:
            raise ValueError(
                f"{_OP}: kv_lens has negative entries {listed(negative, lens[negative])} but needs lengths >= 0"
            )
        capacity = pages_per_seq * page
        (over,) = np.nonzero(lens > capacity)
        if over.size:
            raise ValueError(
                f"{_OP}: kv_lens has entries {listed(over, lens[over])} but needs kv_lens <= "
                f"pages_per_seq * page = {pages_per_seq} * {page} = {capacity}"
            )
    if lens is not None and table is not None:
        table = table.astype(np.int64)
        used = np.arange(pages_per_seq)[None, :] < -(-lens[:, None] // page)
        bad = used & ((table < 0) | (table >= pages))
        if bad.any():
            b, j = (int(i[0]) for i in np.nonzero(bad))
            raise ValueError(
                f"{_OP}: page_indices[{b}, {j}] is {int(table[b, j])} but needs a page index in [0, P={pages}) "
                f"(kv_pages has {pages} pages; only the first ceil(kv_len / page) entries of a row are read)"
            )


def check_mla_paged_attention_values(q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any, **_: Any) -> None:
    """The value checks of a call already validated once (the eager fast path): lengths, page table."""
    _check_values(kv_lens, page_indices, int(kv_pages.shape[0]), int(kv_pages.shape[1]))


def check_mla_paged_attention_args(
    q: Any,
    kv_pages: Any,
    kv_lens: Any,
    page_indices: Any,
    *,
    v_head_dim: Any,
    softmax_scale: Any,
    causal: Any,
) -> tuple[int, float, bool]:
    """Validate ``mla_paged_attention`` arguments; resolve the scale.

    Shapes and dtypes are always checked. Where values are concrete, ``kv_lens`` must lie in
    ``[0, pages_per_seq * page]`` and the pages each sequence uses (the first
    ``ceil(kv_len / page)`` of its row of ``page_indices``) in ``[0, P)``; other entries are
    never read and may hold anything.

    Args:
        q: ``[B, Sq, Hq, Dk]``.
        kv_pages: ``[P, page, Dk]``.
        kv_lens: ``[B]`` integer.
        page_indices: ``[B, pages_per_seq]`` integer.
        v_head_dim: int in ``[1, Dk]``: values are the first ``v_head_dim`` dims of each position.
        softmax_scale: ``None`` (then ``1/sqrt(Dk)``) or a finite positive number.
        causal: bool.

    Returns:
        ``(v_head_dim, softmax_scale, causal)`` as Python values.

    Raises:
        ValueError: naming the argument, what it got, and what it needs.
    """
    _check_shapes(q, kv_pages, kv_lens, page_indices)
    dk = int(q.shape[3])
    if not is_int(v_head_dim) or not 1 <= int(v_head_dim) <= dk:
        raise ValueError(
            f"{_OP}: v_head_dim is {v_head_dim!r} but needs an int in [1, Dk={dk}] (values are the first "
            "v_head_dim dims of each latent position, e.g. 512 of DeepSeek-V3's 576)"
        )
    if not isinstance(causal, bool | np.bool_):
        raise ValueError(f"{_OP}: causal is {causal!r} but needs a bool")
    _check_values(kv_lens, page_indices, int(kv_pages.shape[0]), int(kv_pages.shape[1]))
    return int(v_head_dim), resolve_scale(_OP, softmax_scale, dk), bool(causal)
