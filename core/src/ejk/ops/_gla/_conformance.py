"""The conformance check of ``gla``: odd lengths, states in and out, packed sequences (an empty one
included), one-token decoding; values, final states and every gradient. :func:`compare_recurrent`
is shared with ``ssd``'s check."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._gla._op import gla
from ejk.ops._gla._reference import reference_gla
from ejk.testing._cases import fast_jit
from ejk.testing._op_checks import assert_close, normal

__all__ = ["GLA_CASES", "check_gla", "compare_recurrent", "log_gates"]

#: ``(B, T, H, K, V, cu_seqlens, with initial state)`` of :func:`check_gla`.
GLA_CASES: tuple[tuple[int, int, int, int, int, tuple[int, ...] | None, bool], ...] = (
    (2, 37, 2, 16, 8, None, False),  # T not a multiple of any chunk
    (2, 20, 2, 8, 16, None, True),
    (1, 40, 2, 16, 8, (0, 5, 5, 23, 40), True),  # packed, with an empty sequence
    (3, 1, 2, 8, 8, None, True),  # one decoding step
)


def log_gates(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """Log forget gates ``<= 0`` as models make them: ``log_sigmoid`` of normals shifted by 2."""
    return jnp.asarray(jax.nn.log_sigmoid(jnp.asarray(rng.standard_normal(shape, np.float32) + 2.0)), dtype)


def compare_recurrent(ours: Callable[..., Any], ref: Callable[..., Any], args: tuple[Any, ...], dtype: Any,
                      label: str, seed: int = 7) -> None:
    """Assert ``ours(*args)`` matches ``ref(*args)`` (an output and a final state) within the tolerance of
    ``dtype``, and so do the gradients of both outputs under one random cotangent, for every argument
    that is not ``None``."""
    rng = np.random.default_rng(seed)
    outs = jax.eval_shape(ref, *args)
    cotangent = tuple(normal(rng, o.shape, o.dtype) for o in outs)
    live = [i for i, x in enumerate(args) if x is not None]

    def run(fn: Callable[..., Any]) -> Callable[..., Any]:
        def both(*xs: Any) -> Any:
            def of_live(*values: Any) -> Any:
                merged = list(args)
                for i, x in zip(live, values, strict=True):
                    merged[i] = x
                return tuple(fn(*merged))

            y, vjp = jax.vjp(of_live, *xs)
            return y, vjp(cotangent)

        return both

    live_args = tuple(args[i] for i in live)
    got, got_grads = fast_jit(run(ours))(*live_args)
    want, want_grads = fast_jit(run(ref))(*live_args)
    assert_close(got[0], want[0], dtype, what=f"{label} output", strict=True)
    assert_close(got[1], want[1], dtype, what=f"{label} final state", strict=True)
    for i, got_g, want_g in zip(live, got_grads, want_grads, strict=True):
        assert_close(got_g, want_g, dtype, what=f"{label} gradient of argument {i}", strict=True)


def check_gla(platform: str, *, dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16), cfg: Any = None) -> int:
    """``ejk.gla`` on ``platform`` against the step-by-step reference; returns the cases run."""
    for dtype in dtypes:
        for seed, (b, t, h, dk, dv, cu, init) in enumerate(GLA_CASES):
            rng = np.random.default_rng(seed)
            q, k = normal(rng, (b, t, h, dk), dtype), normal(rng, (b, t, h, dk), dtype)
            v = normal(rng, (b, t, h, dv), dtype)
            g = log_gates(rng, (b, t, h, dk), jnp.float32)
            cu_seqlens = None if cu is None else jnp.asarray(cu, jnp.int32)
            states = b if cu is None else len(cu) - 1
            state = normal(rng, (states, h, dk, dv), jnp.float32) if init else None
            label = f"gla[{platform}] B={b} T={t} H={h} K={dk} V={dv} cu={cu} {jnp.dtype(dtype).name}"

            def ours(q: Any, k: Any, v: Any, g: Any, s: Any, cu: Any = cu_seqlens) -> Any:
                return gla(q, k, v, g, initial_state=s, output_final_state=True, cu_seqlens=cu,
                           platform=platform, cfg=cfg)

            def ref(q: Any, k: Any, v: Any, g: Any, s: Any, cu: Any = cu_seqlens) -> Any:
                return reference_gla(q, k, v, g, s, cu)

            compare_recurrent(ours, ref, (q, k, v, g, state), dtype, label)
    return len(dtypes) * len(GLA_CASES)
