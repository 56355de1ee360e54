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
from ejk.ops._flash_attention_varlen._reference import reference_flash_attention_varlen
from ejk.testing._op_checks import compare, normal

__all__ = ["VARLEN_CASES", "check_flash_attention_varlen", "varlen_inputs"]

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
    options = {name: case[name] for name in ("causal", "sliding_window", "logits_soft_cap") if name in case}
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
