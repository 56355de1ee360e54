"""The conformance checks of ``flash_attention`` and ``flash_attention_lse``: a platform's implementation
against the reference.

The edge cases every platform must get right: Sq ≠ Sk, length 1, GQA ratios, masks, soft cap,
bias, segments, rows that see no key; forward values and gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._flash_attention._op import flash_attention
from ejk.ops._flash_attention._reference import reference_flash_attention, reference_flash_attention_lse
from ejk.testing._cases import values_and_grads
from ejk.testing._op_checks import assert_close, compare, normal

__all__ = ["FLASH_ATTENTION_CASES", "SINKS_CASES", "check_flash_attention", "check_flash_attention_lse",
           "check_flash_attention_sinks", "flash_inputs"]

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


#: Cases with attention sinks: odd lengths, GQA 1/2/4/8, windows (gpt-oss: causal, window, D=64),
#: soft cap and bias (which do not touch the sink), rows that see no key, a sink that dominates.
SINKS_CASES: tuple[dict[str, Any], ...] = (
    {"shape": (2, 13, 4, 13, 4, 16)},
    {"shape": (1, 17, 8, 23, 4, 16), "causal": True},
    {"shape": (1, 9, 8, 9, 2, 32), "causal": True, "sliding_window": 4},
    {"shape": (1, 5, 8, 11, 1, 64), "causal": True, "sliding_window": (3, 0), "logits_soft_cap": 4.0},
    {"shape": (1, 20, 2, 8, 2, 16), "causal": True},  # Sq > Sk: leading rows see nothing
    {"shape": (2, 16, 4, 16, 2, 16), "segments": True},  # with rows that see no key
    {"shape": (2, 10, 2, 12, 1, 8), "bias": True},
    {"shape": (1, 1, 4, 33, 1, 32), "causal": True, "sink_scale": 4.0},  # decode-like; sinks dominate
)


def sink_logits(case: dict[str, Any], seed: int) -> jax.Array:
    """``[Hq]`` float32 sink logits of a case (scaled by its ``sink_scale``, default 1)."""
    rng = np.random.default_rng(seed + 101)
    heads = case["shape"][2]
    return jnp.asarray(rng.standard_normal(heads) * case.get("sink_scale", 1.0), jnp.float32)


def flash_inputs(case: dict[str, Any], dtype: Any, seed: int) -> tuple[tuple[jax.Array, ...], dict[str, Any]]:
    b, sq, hq, sk, hkv, d = case["shape"]
    rng = np.random.default_rng(seed)  # on the host: jax.random would compile a program per shape
    q = normal(rng, (b, sq, hq, d), dtype)
    k = normal(rng, (b, sk, hkv, d), dtype)
    v = normal(rng, (b, sk, hkv, d), dtype)
    options: dict[str, Any] = {name: case[name] for name in ("causal", "sliding_window", "logits_soft_cap")
                               if name in case}
    if case.get("bias"):
        options["bias"] = normal(rng, (b, 1, sq, sk), dtype)
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
    """``flash_attention(..., platform=platform)`` against the reference; returns the cases run.

    Gradients of q, k, v (and bias) are compared with ``jax.vjp`` of the reference when
    ``grads`` is set.
    """
    for dtype in dtypes:
        for seed, case in enumerate(cases):
            (q, k, v), options = flash_inputs(case, dtype, seed)
            bias = options.pop("bias", None)

            def ours(q: jax.Array, k: jax.Array, v: jax.Array, bias: Any, options: dict[str, Any] = options) -> Any:
                return flash_attention(q, k, v, bias=bias, platform=platform, cfg=cfg, **options)

            def ref(q: jax.Array, k: jax.Array, v: jax.Array, bias: Any, options: dict[str, Any] = options) -> Any:
                return reference_flash_attention(q, k, v, bias=bias, **options)

            label = f"flash_attention[{platform}] {case} {jnp.dtype(dtype).name}"
            compare(ours, ref, (q, k, v, bias), dtype, label, grads)
    return len(dtypes) * len(cases)


def _assert_lse_close(got: Any, want: Any, dtype: Any, label: str) -> None:
    """Equal ``-inf`` rows (those that see no key), and finite values within the tolerance of ``dtype``."""
    got32, want32 = np.asarray(got, np.float32), np.asarray(want, np.float32)
    empty = np.isneginf(want32)
    if not np.array_equal(np.isneginf(got32), empty):
        raise AssertionError(f"{label}: lse is -inf on other rows than the reference's (the rows that see no key)")
    assert_close(np.where(empty, 0.0, got32), np.where(empty, 0.0, want32), dtype, what=label)


def check_flash_attention_lse(
    platform: str,
    *,
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    cases: Sequence[dict[str, Any]] = FLASH_ATTENTION_CASES,
    grads: bool = True,
    cfg: Any = None,
) -> int:
    """``ejk.flash_attention_lse(..., platform=platform)`` against the reference; returns the cases run.

    Both outputs are compared: rows that see no key must give zeros and an lse of ``-inf``.
    With ``grads``, the gradients of q, k, v (and bias) for cotangents on both outputs are compared
    with the reference's, a random lse cotangent on every row (those that see no key get none).
    """
    from ejk.ops._flash_attention._lse import flash_attention_lse

    for dtype in dtypes:
        for seed, case in enumerate(cases):
            (q, k, v), options = flash_inputs(case, dtype, seed)
            bias = options.pop("bias", None)

            def ours(q: jax.Array, k: jax.Array, v: jax.Array, bias: Any, options: dict[str, Any] = options) -> Any:
                return flash_attention_lse(q, k, v, bias=bias, platform=platform, cfg=cfg, **options)

            def ref(q: jax.Array, k: jax.Array, v: jax.Array, bias: Any, options: dict[str, Any] = options) -> Any:
                return reference_flash_attention_lse(q, k, v, bias=bias, **options)

            label = f"flash_attention_lse[{platform}] {case} {jnp.dtype(dtype).name}"
            args = (q, k, v, bias)
            rng = np.random.default_rng(seed + 7)
            out_shape, lse_shape = (x.shape for x in jax.eval_shape(ref, *args))
            cotangent = (normal(rng, out_shape, dtype), normal(rng, lse_shape, jnp.float32))
            if grads:
                (out, lse), got_grads = values_and_grads(ours, args, cotangent=cotangent)
                (want, want_lse), want_grads = values_and_grads(ref, args, cotangent=cotangent)
            else:
                (out, lse), (want, want_lse) = ours(*args), ref(*args)
            assert_close(out, want, dtype, what=f"{label} out")
            _assert_lse_close(lse, want_lse, dtype, f"{label} lse")
            if np.any(np.asarray(out, np.float32)[np.moveaxis(np.isneginf(np.asarray(lse)), 1, 2)]):
                raise AssertionError(f"{label}: rows that see no key (lse -inf) must be zeros")
            if grads:
                for name, got_g, want_g in zip(("dq", "dk", "dv", "dbias"), got_grads, want_grads, strict=True):
                    if want_g is not None and got_g is not None:
                        assert_close(got_g, want_g, dtype, what=f"{label} gradient {name}")
    return len(dtypes) * len(cases)


def check_flash_attention_sinks(
    platform: str,
    *,
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    cases: Sequence[dict[str, Any]] = SINKS_CASES,
    grads: bool = True,
    lse: bool = False,
    cfg: Any = None,
    precision: Any = "highest",
) -> int:
    """``flash_attention(..., sinks=...)`` (or ``flash_attention_lse`` with ``lse``) on ``platform``
    against the reference, values and (with ``grads``) the gradients of q, k, v, bias and the sinks;
    rows that see no key must be zeros (and ``-inf`` lse). Returns the cases run."""
    from ejk.ops._flash_attention._lse import flash_attention_lse

    for dtype in dtypes:
        for seed, case in enumerate(cases):
            (q, k, v), options = flash_inputs(case, dtype, seed)
            bias = options.pop("bias", None)
            sinks = sink_logits(case, seed)

            def ours(q: jax.Array, k: jax.Array, v: jax.Array, bias: Any, sinks: jax.Array,
                     options: dict[str, Any] = options) -> Any:
                fn = flash_attention_lse if lse else flash_attention
                return fn(q, k, v, bias=bias, sinks=sinks, platform=platform, cfg=cfg, precision=precision,
                          **options)

            def ref(q: jax.Array, k: jax.Array, v: jax.Array, bias: Any, sinks: jax.Array,
                    options: dict[str, Any] = options) -> Any:
                fn = reference_flash_attention_lse if lse else reference_flash_attention
                return fn(q, k, v, bias=bias, sinks=sinks, **options)

            label = f"flash_attention{'_lse' if lse else ''}[{platform}] sinks {case} {jnp.dtype(dtype).name}"
            args = (q, k, v, bias, sinks)
            if not lse:
                compare(ours, ref, args, dtype, label, grads)
                continue
            rng = np.random.default_rng(seed + 7)
            out_shape, lse_shape = (x.shape for x in jax.eval_shape(ref, *args))
            cotangent = (normal(rng, out_shape, dtype), normal(rng, lse_shape, jnp.float32))
            if grads:
                (out, got_lse), got_grads = values_and_grads(ours, args, cotangent=cotangent)
                (want, want_lse), want_grads = values_and_grads(ref, args, cotangent=cotangent)
            else:
                (out, got_lse), (want, want_lse) = ours(*args), ref(*args)
            assert_close(out, want, dtype, what=f"{label} out")
            _assert_lse_close(got_lse, want_lse, dtype, f"{label} lse")
            if grads:
                for name, got_g, want_g in zip(("dq", "dk", "dv", "dbias", "dsinks"), got_grads, want_grads,
                                               strict=True):
                    if want_g is not None and got_g is not None:
                        assert_close(got_g, want_g, dtype, what=f"{label} gradient {name}")
    return len(dtypes) * len(cases)
