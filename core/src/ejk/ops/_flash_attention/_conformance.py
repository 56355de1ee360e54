"""The conformance check of ``flash_attention``: a platform's implementation against the reference.

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
from ejk.ops._flash_attention._reference import reference_flash_attention
from ejk.testing._op_checks import compare, normal

__all__ = ["FLASH_ATTENTION_CASES", "check_flash_attention", "flash_inputs"]

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
