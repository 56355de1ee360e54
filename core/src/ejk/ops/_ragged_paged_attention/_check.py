"""Validation of ``ragged_paged_attention`` arguments; lengths and page tables are checked where concrete."""

from __future__ import annotations

from typing import Any

import numpy as np

from ejk.ops._check_arrays import (
    concrete,
    listed,
    require_array,
    require_floating,
    require_integer,
    require_ndim,
    shape_of,
)
from ejk.ops._check_common import normalize_window, optional_positive
from ejk.ops._check_common import softmax_scale as resolve_scale

__all__ = ["check_ragged_paged_attention_args", "check_ragged_paged_attention_values"]


def _check_paged_shapes(
    q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any, num_seqs: Any
) -> None:
    op = "ragged_paged_attention"
    tokens, hq, d = require_ndim(op, "q", q, 3, "[T, Hq, D]")
    if d < 1:
        raise ValueError(f"ragged_paged_attention: q has shape {(tokens, hq, d)} but needs [T, Hq, D] with D >= 1")
    k_shape = require_ndim(op, "k_pages", k_pages, 4, f"[P, page, Hkv, D={d}]")
    pages, page, hkv, kd = k_shape
    if kd != d or pages < 1 or page < 1 or hkv < 1:
        raise ValueError(
            f"ragged_paged_attention: k_pages has shape {k_shape} but needs [P, page, Hkv, D={d}] "
            f"with P, page and Hkv at least 1 (q has shape {(tokens, hq, d)})"
        )
    v_shape = require_ndim(op, "v_pages", v_pages, 4, f"[P={pages}, page={page}, Hkv={hkv}, Dv]")
    if v_shape[:3] != k_shape[:3]:
        raise ValueError(
            f"ragged_paged_attention: v_pages has shape {v_shape} but needs "
            f"[P={pages}, page={page}, Hkv={hkv}, Dv] to match k_pages"
        )
    if hq % hkv:
        raise ValueError(
            f"ragged_paged_attention: q has {hq} heads (shape {(tokens, hq, d)}) but needs a multiple "
            f"of the {hkv} kv heads of k_pages"
        )
    (seqs,) = require_ndim(op, "kv_lens", kv_lens, 1, "[S]")
    pi_shape = require_ndim(op, "page_indices", page_indices, 2, f"[S={seqs}, pages_per_seq]")
    if pi_shape[0] != seqs:
        raise ValueError(
            f"ragged_paged_attention: page_indices has shape {pi_shape} but needs [S={seqs}, pages_per_seq] "
            "(one row per sequence of kv_lens)"
        )
    cu_shape = require_ndim(op, "cu_q_lens", cu_q_lens, 1, f"[S+1={seqs + 1}]")
    if cu_shape[0] != seqs + 1:
        raise ValueError(f"ragged_paged_attention: cu_q_lens has shape {cu_shape} but needs [S+1={seqs + 1}]")
    require_array(op, "num_seqs", num_seqs, "scalar")
    if shape_of(num_seqs) not in ((), (1,)):
        raise ValueError(
            f"ragged_paged_attention: num_seqs has shape {shape_of(num_seqs)} but needs a scalar (shape ())"
        )
    for name, x in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages)):
        require_floating(op, name, x)
    for name, x in (("kv_lens", kv_lens), ("page_indices", page_indices), ("cu_q_lens", cu_q_lens),
                    ("num_seqs", num_seqs)):
        require_integer(op, name, x)


def _check_paged_values(
    tokens: int,
    pages: int,
    page: int,
    kv_lens: Any,
    page_indices: Any,
    cu_q_lens: Any,
    num_seqs: Any,
) -> None:
    """Value checks for the live sequences (all S of them when num_seqs is not concrete)."""
    seqs, pages_per_seq = shape_of(page_indices)
    n_value = concrete(num_seqs)
    live = seqs
    if n_value is not None:
        live = int(n_value.reshape(()))
        if not 0 <= live <= seqs:
            raise ValueError(
                f"ragged_paged_attention: num_seqs is {live} but needs 0 <= num_seqs <= S={seqs} "
                "(the sequences of kv_lens)"
            )
    lens, cu, table = concrete(kv_lens), concrete(cu_q_lens), concrete(page_indices)
    if lens is not None:
        lens = lens[:live].astype(np.int64)
        _check_kv_lens(lens, pages_per_seq, page)
    if cu is not None:
        cu = cu[: live + 1].astype(np.int64)
        _check_cu_q_lens(cu, tokens)
    if lens is not None and cu is not None:
        q_lens = np.diff(cu)
        (bad,) = np.nonzero(q_lens > lens)
        if bad.size:
            s = int(bad[0])
            raise ValueError(
                f"ragged_paged_attention: cu_q_lens gives sequence {s} {int(q_lens[s])} queries but "
                f"kv_lens[{s}] is {int(lens[s])}; needs q_len <= kv_len (queries are the last "
                "positions of their sequence)"
            )
    if lens is not None and table is not None:
        _check_page_indices(table[:live].astype(np.int64), lens, page, pages)


def _check_kv_lens(lens: np.ndarray[Any, Any], pages_per_seq: int, page: int) -> None:
    (negative,) = np.nonzero(lens < 0)
    if negative.size:
        raise ValueError(
            f"ragged_paged_attention: kv_lens has negative entries {listed(negative, lens[negative])} "
            "but needs non-negative lengths"
        )
    capacity = pages_per_seq * page
    (over,) = np.nonzero(lens > capacity)
    if over.size:
        raise ValueError(
            f"ragged_paged_attention: kv_lens has entries {listed(over, lens[over])} but needs "
            f"kv_lens <= pages_per_seq * page = {pages_per_seq} * {page} = {capacity}"
        )


def _check_cu_q_lens(cu: np.ndarray[Any, Any], tokens: int) -> None:
    if cu[0] < 0:
        raise ValueError(f"ragged_paged_attention: cu_q_lens starts at {int(cu[0])} but needs a start >= 0")
    q_lens = np.diff(cu)
    (negative,) = np.nonzero(q_lens < 0)
    if negative.size:
        raise ValueError(
            "ragged_paged_attention: cu_q_lens gives negative query lengths "
            f"{listed(negative, q_lens[negative])} but needs to be non-decreasing"
        )
    if cu[-1] > tokens:
        raise ValueError(
            f"ragged_paged_attention: cu_q_lens ends at {int(cu[-1])} (for the live sequences) "
            f"but needs an end <= T={tokens} (the rows of q)"
        )


def _check_page_indices(table: np.ndarray[Any, Any], lens: np.ndarray[Any, Any], page: int, pages: int) -> None:
    """Pages a live sequence uses (the first ceil(kv_len / page) of its row) must exist."""
    used = np.arange(table.shape[1])[None, :] < -(-lens[:, None] // page)
    bad = used & ((table < 0) | (table >= pages))
    if bad.any():
        s, j = (int(i[0]) for i in np.nonzero(bad))
        raise ValueError(
            f"ragged_paged_attention: page_indices[{s}, {j}] is {int(table[s, j])} but needs a page "
            f"index in [0, P={pages}) (k_pages has {pages} pages)"
        )


def check_ragged_paged_attention_values(q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any,
                                        cu_q_lens: Any, num_seqs: Any, **_: Any) -> None:
    """The value checks of a call already validated once (the eager fast path): lengths, offsets, pages."""
    pages, page = shape_of(k_pages)[:2]
    _check_paged_values(shape_of(q)[0], pages, page, kv_lens, page_indices, cu_q_lens, num_seqs)


def check_ragged_paged_attention_args(
    q: Any,
    k_pages: Any,
    v_pages: Any,
    kv_lens: Any,
    page_indices: Any,
    cu_q_lens: Any,
    num_seqs: Any,
    *,
    softmax_scale: float | None,
    sliding_window: int | tuple[int, int] | None,
    logits_soft_cap: float | None,
) -> tuple[float, tuple[int, int] | None]:
    """Validate ``ragged_paged_attention`` arguments; resolve the scale, normalise the window.

    Shapes and dtypes are always checked. Where values are concrete, the live sequences
    (``s < num_seqs``; all ``S`` when ``num_seqs`` is traced) must have ``kv_lens`` in
    ``[0, pages_per_seq * page]``, query lengths (from ``cu_q_lens``, which must be
    non-decreasing from ``>= 0`` and end at ``<= T``) at most their ``kv_lens``, and the
    pages they use in ``[0, P)``; ``num_seqs`` must lie in ``[0, S]``.

    Args:
        q: ``[T, Hq, D]``.
        k_pages: ``[P, page, Hkv, D]``.
        v_pages: ``[P, page, Hkv, Dv]``.
        kv_lens: ``[S]`` integer.
        page_indices: ``[S, pages_per_seq]`` integer.
        cu_q_lens: ``[S+1]`` integer.
        num_seqs: integer scalar.
        softmax_scale: ``None`` (then ``1/sqrt(D)``) or a finite positive number.
        sliding_window: ``None``, ``w`` or ``(left, right)``, non-negative ints; ``right`` is
            dropped (attention is causal) and ``left`` clamped to ``pages_per_seq * page - 1``.
        logits_soft_cap: ``None`` or a finite positive number.

    Returns:
        ``(softmax_scale, sliding_window)``: the resolved scale and the window as
        ``(left, 0)`` (attention is causal, so nothing to the right is visible) or ``None``.

    Raises:
        ValueError: naming the argument, what it got, and what it needs.
    """
    _check_paged_shapes(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
    op = "ragged_paged_attention"
    optional_positive(op, "logits_soft_cap", logits_soft_cap)
    tokens, _, d = shape_of(q)
    pages, page = shape_of(k_pages)[:2]
    capacity = shape_of(page_indices)[1] * page  # no context is longer: no distance exceeds capacity - 1
    window = normalize_window(op, "sliding_window", sliding_window, causal=True, max_left=capacity - 1)
    _check_paged_values(tokens, pages, page, kv_lens, page_indices, cu_q_lens, num_seqs)
    return resolve_scale(op, softmax_scale, d), window
