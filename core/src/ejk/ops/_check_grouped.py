"""Input validation for ``matmul``, ``grouped_matmul`` and ``ragged_paged_attention``.

Every error is a :class:`ValueError` that names the operation, the argument, what it got
and what it needs. Shape and dtype checks always run (they only need ``.shape`` and
``.dtype``, so they work on tracers and ``jax.ShapeDtypeStruct``). Checks on *values* run
only where the values are concrete (not inside ``jax.jit``/``vmap``/``grad`` tracing),
because a traced value cannot be read.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._check_common import float_dtype_problem, normalize_window, optional_positive
from ejk.ops._check_common import softmax_scale as resolve_scale

__all__ = ["check_grouped_matmul_args", "check_matmul_args", "check_ragged_paged_attention_args"]

_INTEGER = "an integer dtype (int32)"
_MAX_LISTED = 4  # offending entries quoted in an error message


# -- helpers ----------------------------------------------------------------------------------


def _shape(x: Any) -> tuple[int, ...]:
    """The shape of an array-like (arrays, tracers, ShapeDtypeStructs, Python scalars, lists)."""
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else tuple(np.shape(x))


def _dtype(x: Any) -> np.dtype[Any]:
    dtype = getattr(x, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.asarray(x).dtype


def _concrete(x: Any) -> np.ndarray[Any, Any] | None:
    """The value of ``x`` as a NumPy array, or ``None`` when it is traced or abstract."""
    if isinstance(x, (jax.core.Tracer, jax.ShapeDtypeStruct)):
        return None
    if isinstance(x, (jax.Array, np.ndarray, np.generic, numbers.Number, list, tuple)):
        return np.asarray(x)
    return None


def _require_array(op: str, name: str, x: Any, needs: str) -> None:
    if x is None or isinstance(x, (str, bytes)):
        raise ValueError(f"{op}: {name} is {x!r} but needs an array {needs}")


def _require_ndim(op: str, name: str, x: Any, ndim: int, needs: str) -> tuple[int, ...]:
    _require_array(op, name, x, needs)
    shape = _shape(x)
    if len(shape) != ndim:
        raise ValueError(f"{op}: {name} has shape {shape} but needs {needs} ({ndim} dimensions)")
    return shape


def _require_floating(op: str, name: str, x: Any) -> None:
    dtype = _dtype(x)
    needs = float_dtype_problem(dtype)
    if needs is not None:
        raise ValueError(f"{op}: {name} has dtype {dtype} but needs {needs}")


def _require_integer(op: str, name: str, x: Any) -> None:
    dtype = _dtype(x)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"{op}: {name} has dtype {dtype} but needs {_INTEGER}")


def _listed(indices: np.ndarray[Any, Any], values: np.ndarray[Any, Any]) -> str:
    """``"[2]=-1, [5]=-3"`` for the first few offending entries."""
    shown = ", ".join(f"[{int(i)}]={int(v)}" for i, v in zip(indices[:_MAX_LISTED], values[:_MAX_LISTED], strict=False))
    more = len(indices) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


# -- matmul -----------------------------------------------------------------------------------


def _contraction_needs(b_ndim: int, k: int) -> str:
    if b_ndim == 1:
        return f"[k={k}]"
    return f"[k={k}, n]" if b_ndim == 2 else f"[..., k={k}, n]"


def check_matmul_args(a: Any, b: Any) -> None:
    """Validate the arguments of ``matmul(a, b)``, shaped as for ``jnp.matmul``.

    ``a [..., m, k] @ b [..., k, n]`` with batch dimensions that broadcast (NumPy rules); a
    1-D ``a`` is a row ``[k]`` and a 1-D ``b`` a column ``[k]``, whose dimension is dropped
    from the result, as in ``jnp.matmul``.

    Args:
        a: ``[..., m, k]`` or ``[k]``, floating.
        b: ``[..., k, n]`` or ``[k]``, floating.

    Raises:
        ValueError: naming the argument, its shape, dtype or value, and what it needs.
    """
    op = "matmul"
    _require_array(op, "a", a, "[..., m, k] or [k]")
    a_shape = _shape(a)
    if not a_shape:
        raise ValueError("matmul: a has shape () but needs [..., m, k] or [k] (at least 1 dimension; "
                         "multiply by a scalar with *)")
    k = a_shape[-1]
    _require_array(op, "b", b, f"[..., k={k}, n] or [k={k}]")
    b_shape = _shape(b)
    if not b_shape:
        raise ValueError(f"matmul: b has shape () but needs [..., k={k}, n] or [k={k}] (at least 1 dimension; "
                         "multiply by a scalar with *)")
    b_k = b_shape[-2] if len(b_shape) >= 2 else b_shape[0]
    if b_k != k:
        where = "its first dimension" if len(b_shape) <= 2 else "its second-to-last dimension"
        raise ValueError(
            f"matmul: b has shape {b_shape} but needs {_contraction_needs(len(b_shape), k)} ({where} must match "
            f"the last dimension of a, whose shape is {a_shape})"
        )
    a_batch, b_batch = a_shape[:-2], b_shape[:-2]
    try:
        np.broadcast_shapes(a_batch, b_batch)
    except ValueError:
        raise ValueError(
            f"matmul: b has shape {b_shape} but needs batch dimensions that broadcast with a's {a_batch} "
            f"(a has shape {a_shape}); its batch dimensions {b_batch} differ where neither is 1, aligned from "
            "the right as in jnp.matmul: reshape or insert size-1 axes"
        ) from None
    _require_floating(op, "a", a)
    _require_floating(op, "b", b)


# -- grouped matmul ---------------------------------------------------------------------------


def check_grouped_matmul_args(lhs: Any, rhs: Any, group_sizes: Any) -> None:
    """Validate the arguments of ``grouped_matmul(lhs, rhs, group_sizes)``.

    Args:
        lhs: ``[m, k]`` floating array.
        rhs: ``[g, k, n]`` floating array.
        group_sizes: ``[g]`` integer array; where concrete, non-negative with a sum ``<= m``.

    Raises:
        ValueError: naming the argument, its shape, dtype or value, and what it needs.
    """
    op = "grouped_matmul"
    m, k = _require_ndim(op, "lhs", lhs, 2, "[m, k]")
    rhs_shape = _require_ndim(op, "rhs", rhs, 3, f"[groups, k={k}, n]")
    if rhs_shape[1] != k:
        raise ValueError(
            f"grouped_matmul: rhs has shape {rhs_shape} but needs [groups, k={k}, n] "
            f"(lhs has shape {(m, k)})"
        )
    groups = rhs_shape[0]
    gs_shape = _require_ndim(op, "group_sizes", group_sizes, 1, f"[groups={groups}]")
    if gs_shape[0] != groups:
        raise ValueError(
            f"grouped_matmul: group_sizes has shape {gs_shape} but needs [groups={groups}] "
            f"(one size per matrix of rhs, whose shape is {rhs_shape})"
        )
    _require_floating(op, "lhs", lhs)
    _require_floating(op, "rhs", rhs)
    _require_integer(op, "group_sizes", group_sizes)
    sizes = _concrete(group_sizes)
    if sizes is None:
        return
    (negative,) = np.nonzero(sizes < 0)
    if negative.size:
        raise ValueError(
            f"grouped_matmul: group_sizes has negative entries {_listed(negative, sizes[negative])} "
            "but needs non-negative sizes"
        )
    total = int(sizes.astype(np.int64).sum())
    if total > m:
        raise ValueError(
            f"grouped_matmul: group_sizes sums to {total} but needs a sum <= m={m} (the rows of lhs)"
        )


# -- ragged paged attention -------------------------------------------------------------------


def _check_paged_shapes(
    q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any, num_seqs: Any
) -> None:
    op = "ragged_paged_attention"
    tokens, hq, d = _require_ndim(op, "q", q, 3, "[T, Hq, D]")
    if d < 1:
        raise ValueError(f"ragged_paged_attention: q has shape {(tokens, hq, d)} but needs [T, Hq, D] with D >= 1")
    k_shape = _require_ndim(op, "k_pages", k_pages, 4, f"[P, page, Hkv, D={d}]")
    pages, page, hkv, kd = k_shape
    if kd != d or pages < 1 or page < 1 or hkv < 1:
        raise ValueError(
            f"ragged_paged_attention: k_pages has shape {k_shape} but needs [P, page, Hkv, D={d}] "
            f"with P, page and Hkv at least 1 (q has shape {(tokens, hq, d)})"
        )
    v_shape = _require_ndim(op, "v_pages", v_pages, 4, f"[P={pages}, page={page}, Hkv={hkv}, Dv]")
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
    (seqs,) = _require_ndim(op, "kv_lens", kv_lens, 1, "[S]")
    pi_shape = _require_ndim(op, "page_indices", page_indices, 2, f"[S={seqs}, pages_per_seq]")
    if pi_shape[0] != seqs:
        raise ValueError(
            f"ragged_paged_attention: page_indices has shape {pi_shape} but needs [S={seqs}, pages_per_seq] "
            "(one row per sequence of kv_lens)"
        )
    cu_shape = _require_ndim(op, "cu_q_lens", cu_q_lens, 1, f"[S+1={seqs + 1}]")
    if cu_shape[0] != seqs + 1:
        raise ValueError(f"ragged_paged_attention: cu_q_lens has shape {cu_shape} but needs [S+1={seqs + 1}]")
    _require_array(op, "num_seqs", num_seqs, "scalar")
    if _shape(num_seqs) not in ((), (1,)):
        raise ValueError(
            f"ragged_paged_attention: num_seqs has shape {_shape(num_seqs)} but needs a scalar (shape ())"
        )
    for name, x in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages)):
        _require_floating(op, name, x)
    for name, x in (("kv_lens", kv_lens), ("page_indices", page_indices), ("cu_q_lens", cu_q_lens),
                    ("num_seqs", num_seqs)):
        _require_integer(op, name, x)


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
    seqs, pages_per_seq = _shape(page_indices)
    n_value = _concrete(num_seqs)
    live = seqs
    if n_value is not None:
        live = int(n_value.reshape(()))
        if not 0 <= live <= seqs:
            raise ValueError(
                f"ragged_paged_attention: num_seqs is {live} but needs 0 <= num_seqs <= S={seqs} "
                "(the sequences of kv_lens)"
            )
    lens, cu, table = _concrete(kv_lens), _concrete(cu_q_lens), _concrete(page_indices)
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
            f"ragged_paged_attention: kv_lens has negative entries {_listed(negative, lens[negative])} "
            "but needs non-negative lengths"
        )
    capacity = pages_per_seq * page
    (over,) = np.nonzero(lens > capacity)
    if over.size:
        raise ValueError(
            f"ragged_paged_attention: kv_lens has entries {_listed(over, lens[over])} but needs "
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
            f"{_listed(negative, q_lens[negative])} but needs to be non-decreasing"
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
    tokens, _, d = _shape(q)
    pages, page = _shape(k_pages)[:2]
    capacity = _shape(page_indices)[1] * page  # no context is longer: no distance exceeds capacity - 1
    window = normalize_window(op, "sliding_window", sliding_window, causal=True, max_left=capacity - 1)
    _check_paged_values(tokens, pages, page, kv_lens, page_indices, cu_q_lens, num_seqs)
    return resolve_scale(op, softmax_scale, d), window
