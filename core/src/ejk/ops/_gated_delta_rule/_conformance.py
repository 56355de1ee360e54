"""The conformance check of ``gated_delta_rule``: outputs, final states and every gradient against the reference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._gated_delta_rule._op import gated_delta_rule
from ejk.ops._gated_delta_rule._reference import reference_gated_delta_rule
from ejk.testing._op_checks import assert_close

__all__ = ["GDR_CASES", "GdrCase", "check_gated_delta_rule", "gdr_inputs"]


@attrs.frozen(kw_only=True)
class GdrCase:
    """One call: ``[B, T, H, K]`` inputs, ``V`` values, optional packed lengths, initial state and l2 norm."""

    batch: int
    length: int
    heads: int
    dk: int
    dv: int
    seqlens: tuple[int, ...] | None = None
    initial_state: bool = False
    l2norm: bool = False

    @property
    def sequences(self) -> int:
        return self.batch if self.seqlens is None else len(self.seqlens)


#: Odd lengths, lengths below and across a chunk, packed sequences with an empty one, initial states, l2 norm.
GDR_CASES: tuple[GdrCase, ...] = (
    GdrCase(batch=2, length=37, heads=2, dk=16, dv=8, initial_state=True),
    GdrCase(batch=1, length=5, heads=1, dk=8, dv=16, l2norm=True),
    GdrCase(batch=1, length=70, heads=2, dk=16, dv=16, seqlens=(3, 0, 40, 27), initial_state=True, l2norm=True),
)


def gdr_inputs(case: GdrCase, dtype: Any, seed: int = 0) -> tuple[Any, ...]:
    """``(q, k, v, g, beta, initial_state)`` (unit-normalised keys unless the op normalises them, decays
    ``g`` in about ``[-0.7, 0]``, ``beta`` in ``(0, 1)``); ``initial_state`` is ``None`` unless asked for."""
    rng = np.random.default_rng(seed)
    b, t, h, dk, dv = case.batch, case.length, case.heads, case.dk, case.dv
    q = rng.standard_normal((b, t, h, dk), np.float32)
    k = rng.standard_normal((b, t, h, dk), np.float32)
    if not case.l2norm:
        k /= np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)
    v = rng.standard_normal((b, t, h, dv), np.float32)
    g = np.log(rng.uniform(0.5, 1.0, (b, t, h))).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (b, t, h)).astype(np.float32)
    state = rng.standard_normal((case.sequences, h, dk, dv), np.float32) if case.initial_state else None
    arrays = [jnp.asarray(x, dtype) for x in (q, k, v)] + [jnp.asarray(g), jnp.asarray(beta, dtype)]
    return (*arrays, None if state is None else jnp.asarray(state))


def _cu(case: GdrCase) -> jax.Array | None:
    return None if case.seqlens is None else jnp.asarray(np.concatenate([[0], np.cumsum(case.seqlens)]), jnp.int32)


def check_gated_delta_rule(
    platform: str,
    *,
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    cfg: Any = None,
    cases: Sequence[GdrCase] = GDR_CASES,
    kind: str | None = None,
) -> int:
    """``ejk.gated_delta_rule`` on ``platform`` against the step-by-step reference; returns the cases run.

    Compares ``o``, the final states and the gradients of ``q, k, v, g, beta`` and
    ``initial_state`` for one random cotangent of both outputs, at the tolerance of the input
    dtype (``kind`` picks a row of ``ejk.tolerances``).
    """
    for dtype in dtypes:
        for seed, case in enumerate(cases):
            *args, init = gdr_inputs(case, dtype, seed)
            cu = _cu(case)
            label = f"gated_delta_rule[{platform}] {case} {jnp.dtype(dtype).name}"
            diff = (*args, *(() if init is None else (init,)))

            def ours(*xs: jax.Array, case: GdrCase = case, cu: Any = cu) -> tuple[jax.Array, Any]:
                state = xs[5] if len(xs) > 5 else None
                o, final = gated_delta_rule(*xs[:5], initial_state=state, cu_seqlens=cu, output_final_state=True,
                                            use_qk_l2norm=case.l2norm, platform=platform, cfg=cfg)
                return o, final

            def ref(*xs: jax.Array, case: GdrCase = case, cu: Any = cu) -> tuple[jax.Array, jax.Array]:
                state = xs[5] if len(xs) > 5 else None
                q, k, v, g, beta = xs[:5]
                return reference_gated_delta_rule(q, k, v, g, beta, state, cu, use_qk_l2norm=case.l2norm)

            (o, final), pull = jax.vjp(jax.jit(ours), *diff)
            (want_o, want_final), ref_pull = jax.vjp(jax.jit(ref), *diff)
            if (o.shape, o.dtype, final.shape, final.dtype) != (want_o.shape, want_o.dtype, want_final.shape,
                                                                jnp.dtype(jnp.float32)):
                raise AssertionError(f"{label}: got o {o.shape} {o.dtype}, state {final.shape} {final.dtype}")
            assert_close(o, want_o, dtype, what=f"{label} o", kind=kind)
            assert_close(final, want_final, dtype, what=f"{label} final_state", kind=kind)
            rng = np.random.default_rng(seed + 100)
            cot = (jnp.asarray(rng.standard_normal(o.shape, np.float32), o.dtype),
                   jnp.asarray(rng.standard_normal(final.shape, np.float32)))
            names = ("q", "k", "v", "g", "beta", "initial_state")
            for name, got, want in zip(names, pull(cot), ref_pull(cot), strict=False):
                if (got.shape, got.dtype) != (want.shape, want.dtype):
                    raise AssertionError(f"{label}: gradient of {name} has {got.shape} {got.dtype}, "
                                         f"want {want.shape} {want.dtype}")
                assert_close(got, want, dtype, what=f"{label} gradient {name}", kind=kind)
    return len(dtypes) * len(cases)
