"""The conformance check of ``flash_attention_varlen``: a platform's implementation against the reference.

Edge cases every platform must get right: odd lengths, empty sequences, a padding tail, GQA,
``Sq != Sk`` per sequence, causal rows that see nothing, windows, soft cap, sinks; forward values
and the gradients of q, k, v and sinks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._flash_attention_varlen._op import flash_attention_varlen
from ejk.ops._flash_attention_varlen._reference import reference_flash_attention_varlen, reference_varlen_per_sequence
from ejk.testing._op_checks import assert_close, compare, normal

__all__ = ["VARLEN_CASES", "check_varlen_against_float64", "check_flash_attention_varlen", "varlen_inputs"]

#: Cases: per-sequence query and key lengths, padding rows after the last offset, heads
#: ``(Hq, Hkv)``, head dim and options.
VARLEN_CASES: tuple[dict[str, Any], ...] = (
    {"q_lens": (5, 0, 11, 1), "k_lens": (5, 0, 11, 1), "pad": 3, "heads": (4, 4), "dim": 16},
    {"q_lens": (7, 13, 2), "k_lens": (7, 13, 2), "heads": (8, 2), "dim": 16, "causal": True},
    {"q_lens": (3, 9, 4), "k_lens": (10, 6, 0), "pad": 2, "heads": (4, 1), "dim": 8, "causal": True},
    {"q_lens": (9, 17), "k_lens": (12, 17), "heads": (4, 2), "dim": 16, "sliding_window": (3, 2)},
    {"q_lens": (6, 20), "k_lens": (6, 20), "pad": 1, "heads": (2, 2), "dim": 16, "causal": True,
     "sliding_window": 4, "logits_soft_cap": 5.0, "sinks": True},
    {"q_lens": (1, 12, 5), "k_lens": (8, 12, 5), "heads": (8, 1), "dim": 32, "causal": True, "sinks": True},
)


def varlen_inputs(case: dict[str, Any], dtype: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``((q, k, v, cu_seqlens_q, cu_seqlens_k, sinks), options)`` for one case."""
    rng = np.random.default_rng(seed)
    hq, hkv = case["heads"]
    d = case["dim"]
    tq = sum(case["q_lens"]) + case.get("pad", 0)
    tk = sum(case["k_lens"]) + case.get("pad", 0)
    cu_q = jnp.asarray(np.cumsum([0, *case["q_lens"]]), jnp.int32)
    cu_k = jnp.asarray(np.cumsum([0, *case["k_lens"]]), jnp.int32)
    q, k, v = normal(rng, (tq, hq, d), dtype), normal(rng, (tk, hkv, d), dtype), normal(rng, (tk, hkv, d), dtype)
    sinks = normal(rng, (hq,), jnp.float32) if case.get("sinks") else None
    options: dict[str, Any] = {name: case[name] for name in ("causal", "sliding_window", "logits_soft_cap")
                               if name in case}
    return (q, k, v, cu_q, cu_k, sinks), options


def check_flash_attention_varlen(
    platform: str,
    *,
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    cases: Sequence[dict[str, Any]] = VARLEN_CASES,
    grads: bool = True,
    cfg: Any = None,
) -> int:
    """``flash_attention_varlen(..., platform=platform)`` against the reference; returns the cases run."""
    for dtype in dtypes:
        for seed, case in enumerate(cases):
            (q, k, v, cu_q, cu_k, sinks), options = varlen_inputs(case, dtype, seed)

            def ours(q: jax.Array, k: jax.Array, v: jax.Array, sinks: Any, cu_q: Any = cu_q, cu_k: Any = cu_k,
                     options: dict[str, Any] = options) -> Any:
                return flash_attention_varlen(q, k, v, cu_q, cu_k, sinks=sinks, platform=platform, cfg=cfg,
                                              **options)

            def ref(q: jax.Array, k: jax.Array, v: jax.Array, sinks: Any, cu_q: Any = cu_q, cu_k: Any = cu_k,
                    options: dict[str, Any] = options) -> Any:
                return reference_flash_attention_varlen(q, k, v, cu_q, cu_k, sinks=sinks, **options)

            label = f"flash_attention_varlen[{platform}] {case} {jnp.dtype(dtype).name}"
            compare(ours, ref, (q, k, v, sinks), dtype, label, grads)
    return len(dtypes) * len(cases)


def check_varlen_against_float64(platform: str, case: dict[str, Any], dtype: Any = jnp.float32, *, seed: int = 0,
                          cfg: Any = None, grads: bool = True) -> None:
    """One case on ``platform`` against :func:`reference_varlen_per_sequence` in float64 (each sequence
    attended alone): the output and the gradients of q, k, v and sinks for one random cotangent.

    Raises:
        AssertionError: naming the case and the value that differs.
    """
    (q, k, v, cu_q, cu_k, sinks), options = varlen_inputs(case, dtype, seed)
    label = f"flash_attention_varlen[{platform}] {case} {jnp.dtype(dtype).name} vs float64"
    rng = np.random.default_rng(seed + 11)
    cotangent = normal(rng, (q.shape[0], q.shape[1], v.shape[2]), dtype)
    args = (q, k, v, sinks)

    def ours(q: jax.Array, k: jax.Array, v: jax.Array, sinks: Any) -> Any:
        return flash_attention_varlen(q, k, v, cu_q, cu_k, sinks=sinks, platform=platform, cfg=cfg, **options)

    def ours_vjp(*xs: Any) -> Any:
        y, vjp = jax.vjp(ours, *xs)
        return y, vjp(cotangent) if grads else (None,) * 4

    out, got_grads = jax.jit(ours_vjp)(*args)  # one program: eager calls would compile every small op
    with jax.enable_x64(True):
        wide = tuple(None if x is None else jnp.asarray(np.asarray(x, np.float64)) for x in args)

        def ref_vjp(*xs: Any) -> Any:
            def ref(q: Any, k: Any, v: Any, sinks: Any) -> Any:
                return reference_varlen_per_sequence(q, k, v, case["q_lens"], case["k_lens"], sinks=sinks, **options)

            y, vjp = jax.vjp(ref, *xs)
            return y, vjp(jnp.asarray(cotangent, jnp.float64)) if grads else (None,) * 4

        want, want_grads = jax.jit(ref_vjp)(*wide)
        want = np.asarray(want)
        want_grads = tuple(None if g is None else np.asarray(g) for g in want_grads)
    assert_close(out, want, dtype, what=f"{label} out")
    for name, got_g, want_g in zip(("dq", "dk", "dv", "dsinks"), got_grads, want_grads, strict=True):
        if want_g is not None and got_g is not None:
            assert_close(got_g, want_g, dtype, what=f"{label} gradient {name}")
