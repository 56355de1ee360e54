"""The conformance check of ``ssd``: odd lengths, groups, every option, states in and out, packed
sequences (an empty one included), one-token decoding; values, final states and every gradient."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._gla._conformance import compare_recurrent
from ejk.ops._ssd._op import ssd
from ejk.ops._ssd._reference import reference_ssd
from ejk.testing._op_checks import normal

__all__ = ["SSD_CASES", "check_ssd"]

#: ``(b, T, H, P, G, N, cu_seqlens, with D / dt_bias / softplus, with initial state)`` of :func:`check_ssd`.
SSD_CASES: tuple[tuple[int, int, int, int, int, int, tuple[int, ...] | None, bool, bool], ...] = (
    (2, 37, 4, 8, 2, 16, None, True, False),  # T not a multiple of any chunk, 2 heads per group
    (2, 20, 2, 16, 1, 8, None, False, True),
    (1, 40, 2, 8, 2, 8, (0, 5, 5, 23, 40), True, True),  # packed, with an empty sequence
    (3, 1, 2, 8, 1, 8, None, True, True),  # one decoding step
)


def ssd_inputs(rng: np.random.Generator, b: int, t: int, h: int, p: int, groups: int, n: int, dtype: Any,
               options: bool) -> tuple[Any, ...]:
    """``(x, dt, A, B, C, D, dt_bias)`` as Mamba-2 makes them (``D`` and ``dt_bias`` ``None`` unless ``options``)."""
    x = normal(rng, (b, t, h, p), dtype)
    raw = normal(rng, (b, t, h), jnp.float32)
    dt = raw - 1.0 if options else jax.nn.softplus(raw - 1.0)  # step sizes ~0.3
    a = -jnp.exp(normal(rng, (h,), jnp.float32))
    bb, cc = normal(rng, (b, t, groups, n), dtype), normal(rng, (b, t, groups, n), dtype)
    d = normal(rng, (h,), jnp.float32) if options else None
    bias = 0.5 * normal(rng, (h,), jnp.float32) if options else None
    return x, dt, a, bb, cc, d, bias


def check_ssd(platform: str, *, dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16), cfg: Any = None) -> int:
    """``ejk.ssd`` on ``platform`` against the step-by-step reference; returns the cases run."""
    for dtype in dtypes:
        for seed, (b, t, h, p, groups, n, cu, options, init) in enumerate(SSD_CASES):
            rng = np.random.default_rng(seed)
            args = ssd_inputs(rng, b, t, h, p, groups, n, dtype, options)
            cu_seqlens = None if cu is None else jnp.asarray(cu, jnp.int32)
            states = b if cu is None else len(cu) - 1
            state = normal(rng, (states, h, p, n), jnp.float32) if init else None
            label = f"ssd[{platform}] b={b} T={t} H={h} P={p} G={groups} N={n} cu={cu} {jnp.dtype(dtype).name}"

            def ours(*a: Any, cu: Any = cu_seqlens, softplus: bool = options) -> Any:
                x, dt, aa, bb, cc, d, bias, s = a
                return ssd(x, dt, aa, bb, cc, D=d, dt_bias=bias, dt_softplus=softplus, initial_state=s,
                           output_final_state=True, cu_seqlens=cu, platform=platform, cfg=cfg)

            def ref(*a: Any, cu: Any = cu_seqlens, softplus: bool = options) -> Any:
                x, dt, aa, bb, cc, d, bias, s = a
                return reference_ssd(x, dt, aa, bb, cc, d, bias, s, cu, dt_softplus=softplus)

            compare_recurrent(ours, ref, (*args, state), dtype, label)
    return len(dtypes) * len(SSD_CASES)
