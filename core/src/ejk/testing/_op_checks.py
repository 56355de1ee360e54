"""Conformance of a platform's operations: run the public ops on one platform against the references.

A plugin's test-suite calls, for example, ``check_flash_attention("pallas")`` to compare its
implementation with :func:`reference_flash_attention` over the edge cases every platform must
get right (Sq ≠ Sk, length 1, GQA ratios, masks, soft cap, bias, segments, fully masked rows),
forward values and gradients, with tolerances that fit the dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.testing._cases import paged_batch, values_and_grads
from ejk.testing._reference_attention import reference_flash_attention
from ejk.testing._reference_matmul import reference_grouped_matmul, reference_matmul
from ejk.testing._reference_paged import reference_ragged_paged_attention
from ejk.tolerances import TOLERANCES, tolerance

__all__ = [
    "FLASH_ATTENTION_CASES",
    "check_op",
    "MATMUL_SHAPES",
    "TOLERANCES",
    "assert_close",
    "tolerance",
    "check_flash_attention",
    "check_grouped_matmul",
    "check_matmul",
    "check_ragged_paged_attention",
]

#: Edge cases of flash attention: shapes [B, Sq, Hq, Sk, Hkv, D] and options.
FLASH_ATTENTION_CASES: tuple[dict[str, Any], ...] = (
    {"shape": (2, 16, 4, 16, 4, 16)},
    {"shape": (1, 24, 8, 40, 2, 16), "causal": True},
    {"shape": (1, 1, 4, 33, 1, 32), "causal": True},  # decode-like: Sq = 1, MQA
    {"shape": (1, 9, 2, 1, 2, 8)},  # Sk = 1
    {"shape": (2, 20, 4, 20, 2, 16), "sliding_window": (3, 2)},
    {"shape": (1, 32, 4, 32, 2, 16), "causal": True, "sliding_window": 5, "logits_soft_cap": 5.0},
    {"shape": (2, 12, 2, 14, 1, 8), "bias": True},
    {"shape": (2, 16, 4, 16, 2, 16), "segments": True},  # with rows that see no key
    {"shape": (1, 20, 2, 8, 2, 16), "causal": True},  # Sq > Sk: leading rows see nothing
    {"shape": (1, 8, 2, 12, 1, 256), "causal": True},  # head dim 256
)


def assert_close(got: Any, want: Any, dtype: Any, *, what: str = "output", kind: str | None = None,
                 strict: bool = False) -> None:
    """Compare in float32, scaled by the reference's magnitude, with the tolerance of ``dtype``
    (and ``kind``, see :data:`TOLERANCES`).

    Args:
        got: The result under test.
        want: The reference result.
        dtype: Picks the tolerance (the dtype the computation ran in).
        what: Names the compared value in the failure message.
        kind: A kind of result with its own rows in :data:`TOLERANCES` (e.g. ``"matmul"``).
        strict: Also require ``got`` to have ``want``'s shape and dtype.

    Raises:
        AssertionError: naming ``what``, when the values (or, with ``strict``, shape or dtype) differ.
    """
    if strict and (np.shape(got), jnp.dtype(got.dtype)) != (np.shape(want), jnp.dtype(want.dtype)):
        raise AssertionError(f"{what}: got shape {np.shape(got)} dtype {jnp.dtype(got.dtype).name}, "
                             f"want shape {np.shape(want)} dtype {jnp.dtype(want.dtype).name}")
    got32 = np.asarray(jnp.asarray(got, jnp.float32))
    want32 = np.asarray(jnp.asarray(want, jnp.float32))
    scale = max(float(np.max(np.abs(want32), initial=0.0)), 1.0)
    atol, rtol = tolerance(dtype, kind)
    np.testing.assert_allclose(got32 / scale, want32 / scale, atol=atol, rtol=rtol, err_msg=what)


def _flash_inputs(case: dict[str, Any], dtype: Any, seed: int) -> tuple[tuple[jax.Array, ...], dict[str, Any]]:
    b, sq, hq, sk, hkv, d = case["shape"]
    rng = np.random.default_rng(seed)  # on the host: jax.random would compile a program per shape
    q = _normal(rng, (b, sq, hq, d), dtype)
    k = _normal(rng, (b, sk, hkv, d), dtype)
    v = _normal(rng, (b, sk, hkv, d), dtype)
    options: dict[str, Any] = {name: case[name] for name in ("causal", "sliding_window", "logits_soft_cap")
                               if name in case}
    if case.get("bias"):
        options["bias"] = _normal(rng, (b, 1, sq, sk), dtype)
    if case.get("segments"):
        options["q_segment_ids"] = jnp.asarray(np.arange(sq)[None].repeat(b, 0) // 5, jnp.int32)
        options["kv_segment_ids"] = jnp.asarray(np.arange(sk)[None].repeat(b, 0) // 3 + 1, jnp.int32)
    return (q, k, v), options


def check_flash_attention(
    platform: str,
    *,
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    cases: Sequence[dict[str, Any]] = FLASH_ATTENTION_CASES,
    grads: bool = True,
    cfg: Any = None,
) -> int:
    """``ejk.flash_attention(..., platform=platform)`` against the reference; returns the cases run.

    Gradients of q, k, v (and bias) are compared with ``jax.vjp`` of the reference when
    ``grads`` is set.
    """
    import ejk

    for dtype in dtypes:
        for seed, case in enumerate(cases):
            (q, k, v), options = _flash_inputs(case, dtype, seed)
            bias = options.pop("bias", None)

            def ours(q: jax.Array, k: jax.Array, v: jax.Array, bias: Any, options: dict[str, Any] = options) -> Any:
                return ejk.flash_attention(q, k, v, bias=bias, platform=platform, cfg=cfg, **options)

            def ref(q: jax.Array, k: jax.Array, v: jax.Array, bias: Any, options: dict[str, Any] = options) -> Any:
                return reference_flash_attention(q, k, v, bias=bias, **options)

            label = f"flash_attention[{platform}] {case} {jnp.dtype(dtype).name}"
            _compare(ours, ref, (q, k, v, bias), dtype, label, grads)
    return len(dtypes) * len(cases)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """Standard normal values drawn on the host: no compilation per shape (``jax.random`` compiles one)."""
    return jnp.asarray(rng.standard_normal(shape, np.float32), dtype)


def _compare(ours: Callable[..., Any], ref: Callable[..., Any], args: tuple[Any, ...], dtype: Any, label: str,
             grads: bool) -> None:
    if not grads:
        assert_close(ours(*args), ref(*args), dtype, what=label)
        return
    out, got_grads = values_and_grads(ours, args)  # one cheaply compiled program per case
    want, want_grads = values_and_grads(ref, args)  # the same cotangent (seed 7)
    assert_close(out, want, dtype, what=label)
    names = ("d" + str(i) for i in range(len(args)))
    for name, got_g, want_g in zip(names, got_grads, want_grads, strict=True):
        if want_g is not None and got_g is not None:
            assert_close(got_g, want_g, dtype, what=f"{label} gradient {name}")


#: Shapes of ``check_matmul``: plain, batched, broadcasting batch dimensions and 1-D operands,
#: as ``jnp.matmul`` treats them.
MATMUL_SHAPES: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (
    ((8, 16), (16, 4)),
    ((2, 3, 5, 7), (7, 9)),
    ((1, 1), (1, 1)),
    ((3, 1, 5, 7), (4, 7, 2)),  # batch dims broadcast: [3, 1] with [4] -> [3, 4]
    ((6, 5), (2, 5, 3)),  # only b batched
    ((7,), (2, 7, 3)),  # 1-D a: a row
    ((2, 4, 7), (7,)),  # 1-D b: a column
    ((6,), (6,)),  # both 1-D: a scalar
)


def _check_aval(got: Any, want: Any, label: str) -> None:
    if (got.shape, jnp.dtype(got.dtype)) != (want.shape, jnp.dtype(want.dtype)):
        raise AssertionError(f"{label}: got shape {got.shape} dtype {jnp.dtype(got.dtype).name}, "
                             f"want shape {want.shape} dtype {jnp.dtype(want.dtype).name}")


def check_matmul(
    platform: str,
    *,
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    cfg: Any = None,
    precision: Any = "highest",
    preferred_element_type: Any = None,
    shapes: Sequence[tuple[tuple[int, ...], tuple[int, ...]]] = MATMUL_SHAPES,
) -> int:
    """``ejk.matmul`` on ``platform`` against the reference, with gradients; returns the cases run.

    ``precision`` and ``preferred_element_type`` go to both ``ejk.matmul`` and
    :func:`reference_matmul`; the output's shape and dtype must be ``jnp.matmul``'s (in
    ``preferred_element_type`` when given). Tolerances are those of the input dtype.
    """
    import ejk

    options = {"precision": precision, "preferred_element_type": preferred_element_type}
    for dtype in dtypes:
        for seed, (sa, sb) in enumerate(shapes):
            rng = np.random.default_rng(seed)
            args = (_normal(rng, sa, dtype), _normal(rng, sb, dtype))
            label = f"matmul[{platform}] {sa}x{sb} {jnp.dtype(dtype).name} {options}"

            def ours(a: jax.Array, b: jax.Array) -> jax.Array:
                return ejk.matmul(a, b, platform=platform, cfg=cfg, **options)

            def ref(a: jax.Array, b: jax.Array) -> jax.Array:
                return reference_matmul(a, b, **options)

            want = jax.eval_shape(lambda a, b: jnp.matmul(a, b, preferred_element_type=preferred_element_type), *args)
            _check_aval(jax.eval_shape(ours, *args), want, label)
            _compare(ours, ref, args, dtype, label, grads=True)
    return len(dtypes) * len(shapes)


def check_grouped_matmul(
    platform: str,
    *,
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    cfg: Any = None,
    precision: Any = "highest",
    preferred_element_type: Any = None,
) -> int:
    """``ejk.grouped_matmul`` on ``platform``: uneven, empty and trailing-row groups, with gradients.

    ``precision`` and ``preferred_element_type`` go to both ``ejk.grouped_matmul`` and
    :func:`reference_grouped_matmul`; the output must be ``[m, n]`` in
    ``preferred_element_type`` (``lhs.dtype`` when ``None``).
    """
    import ejk

    options = {"precision": precision, "preferred_element_type": preferred_element_type}
    cases = ((40, 16, 8, [10, 0, 25, 3]), (7, 4, 3, [7]), (33, 8, 5, [0, 0, 33, 0]), (1, 4, 2, [0, 1]),
             (12, 8, 8, [0, 0, 0]))
    for dtype in dtypes:
        for seed, (m, k, n, sizes) in enumerate(cases):
            rng = np.random.default_rng(seed)
            lhs = _normal(rng, (m, k), dtype)
            rhs = _normal(rng, (len(sizes), k, n), dtype)
            group_sizes = jnp.asarray(sizes, jnp.int32)

            def ours(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array = group_sizes) -> jax.Array:
                return ejk.grouped_matmul(lhs, rhs, group_sizes, platform=platform, cfg=cfg, **options)

            def ref(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array = group_sizes) -> jax.Array:
                return reference_grouped_matmul(lhs, rhs, group_sizes, **options)

            label = f"grouped_matmul[{platform}] m={m} sizes={sizes} {jnp.dtype(dtype).name} {options}"
            want = jax.ShapeDtypeStruct((m, n), dtype if preferred_element_type is None else preferred_element_type)
            _check_aval(jax.eval_shape(ours, lhs, rhs), want, label)
            _compare(ours, ref, (lhs, rhs), dtype, label, grads=True)
    return len(dtypes) * len(cases)


def check_ragged_paged_attention(platform: str, *, dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
                                 cfg: Any = None) -> int:
    """``ejk.ragged_paged_attention`` on ``platform``: decode, chunked prefill, a padded batch."""
    import ejk

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
            got = ejk.ragged_paged_attention(*args, platform=platform, cfg=cfg, **options)
            assert_close(got, reference_ragged_paged_attention(*args, **options), dtype,
                         what=f"ragged_paged_attention[{platform}] kv={kv_lens} q={q_lens} {jnp.dtype(dtype).name}")
    return len(dtypes) * len(cases)


def check_op(name: str, platform: str, **options: Any) -> int:
    """Run the conformance check of operation ``name`` (built in or defined by a plugin with
    :func:`ejk.ops.define_op`) on ``platform``; returns the cases run.

    Raises:
        ValueError: for an unknown operation, or one defined without a conformance check.
    """
    from ejk.ops import get_op

    check = get_op(name).check_fn()
    if check is None:
        raise ValueError(f"operation {name!r} was defined without a conformance check (define_op(..., check=))")
    return check(platform, **options)
