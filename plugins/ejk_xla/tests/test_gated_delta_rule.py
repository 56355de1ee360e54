"""ejk-xla's chunked gated delta rule against a float64 step-by-step reference: values, final states and
the gradients of every input, packed sequences, chunk sizes, a long sequence, vmap and the decode step."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import FAST_COMPILE, GdrCase, assert_close, check_op, gdr_inputs, reference_gated_delta_rule
from ejk_xla._gated_delta_rule import GatedDeltaRuleConfig

NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def _cu(case: GdrCase) -> jax.Array | None:
    return None if case.seqlens is None else jnp.asarray(np.concatenate([[0], np.cumsum(case.seqlens)]), jnp.int32)


def outputs_and_grads(fn: Any, args: tuple[jax.Array, ...], seed: int = 3) -> tuple[Any, Any]:
    """``fn(*args)`` (a pair) and its VJP for a fixed random cotangent of both outputs, in one jitted program."""
    shapes = jax.eval_shape(fn, *args)
    rng = np.random.default_rng(seed)
    cot = tuple(jnp.asarray(rng.standard_normal(s.shape), s.dtype) for s in shapes)

    def both(*xs: jax.Array) -> tuple[Any, Any]:
        out, pull = jax.vjp(fn, *xs)
        return out, pull(cot)

    return jax.jit(both, compiler_options=FAST_COMPILE)(*args)


def float64_reference(case: GdrCase, args: tuple[jax.Array, ...]) -> tuple[Any, Any]:
    """The step-by-step reference in float64 (x64 on), with its gradients."""
    with jax.enable_x64(True):
        wide = tuple(jnp.asarray(np.asarray(x, np.float32), jnp.float64) for x in args)
        cu = _cu(case)

        def ref(*xs: jax.Array) -> tuple[jax.Array, jax.Array]:
            return reference_gated_delta_rule(*xs[:5], xs[5] if len(xs) > 5 else None, cu, use_qk_l2norm=case.l2norm)

        (o, final), grads = outputs_and_grads(ref, wide)
        return (np.asarray(o), np.asarray(final)), [np.asarray(x) for x in grads]


def check_case(case: GdrCase, cfg: Any, *, seed: int = 0) -> None:
    *arrays, init = gdr_inputs(case, jnp.float32, seed)
    args = (*arrays, *(() if init is None else (init,)))
    cu = _cu(case)

    def ours(*xs: jax.Array) -> tuple[jax.Array, jax.Array]:
        o, final = ejk.gated_delta_rule(*xs[:5], initial_state=xs[5] if len(xs) > 5 else None, cu_seqlens=cu,
                                        use_qk_l2norm=case.l2norm, output_final_state=True, platform="xla", cfg=cfg)
        return o, final

    (o, final), grads = outputs_and_grads(ours, args)
    (want_o, want_final), want_grads = float64_reference(case, args)
    assert_close(o, want_o, jnp.float32, what="o")
    assert_close(final, want_final, jnp.float32, what="final state")
    for name, got, want in zip(NAMES, grads, want_grads, strict=False):
        assert got.shape == want.shape and got.dtype == jnp.float32, name
        assert_close(got, want, jnp.float32, what=f"d{name}")


@pytest.mark.parametrize("case", [
    GdrCase(batch=2, length=37, heads=1, dk=8, dv=4, initial_state=True),  # odd length: a padded last chunk
    GdrCase(batch=1, length=1, heads=1, dk=4, dv=4),
    GdrCase(batch=1, length=45, heads=2, dk=8, dv=8, seqlens=(0, 16, 3, 0, 26), initial_state=True, l2norm=True),
    GdrCase(batch=1, length=0, heads=1, dk=4, dv=4, seqlens=(0, 0), initial_state=True),
], ids=str)
def test_values_states_and_gradients_match_float64(case: GdrCase) -> None:
    check_case(case, GatedDeltaRuleConfig(chunk=16))


def test_a_long_sequence_stays_accurate() -> None:
    check_case(GdrCase(batch=1, length=2048, heads=1, dk=16, dv=16, initial_state=True, l2norm=True),
               GatedDeltaRuleConfig(chunk=64))


def test_chunk_sizes_agree() -> None:
    case = GdrCase(batch=1, length=70, heads=1, dk=8, dv=8, seqlens=(30, 40))
    q, k, v, g, beta, _ = gdr_inputs(case, jnp.float32)
    outs = [ejk.gated_delta_rule(q, k, v, g, beta, cu_seqlens=_cu(case), output_final_state=True, platform="xla",
                                 cfg=GatedDeltaRuleConfig(chunk=c)) for c in (16, 128)]
    assert_close(outs[0][0], outs[1][0], jnp.float32)
    assert_close(outs[0][1], outs[1][1], jnp.float32)


def test_conformance_in_bfloat16() -> None:
    assert check_op("gated_delta_rule", "xla", dtypes=(jnp.bfloat16,), cases=[
        GdrCase(batch=1, length=24, heads=1, dk=8, dv=8, seqlens=(3, 0, 21), initial_state=True, l2norm=True)]) == 1


def test_traced_offsets_under_jit_and_vmap() -> None:
    case = GdrCase(batch=2, length=24, heads=1, dk=4, dv=4)
    q, k, v, g, beta, _ = gdr_inputs(case, jnp.float32)
    cu = jnp.asarray([0, 10, 24], jnp.int32)

    @jax.jit
    def packed(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, cu: jax.Array) -> Any:
        return ejk.gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True, platform="xla")

    o, final = packed(q[:1], k[:1], v[:1], g[:1], beta[:1], cu)
    want_o, want_final = reference_gated_delta_rule(q[:1], k[:1], v[:1], g[:1], beta[:1], None, cu)
    assert_close(o, want_o, jnp.float32)
    assert_close(final, want_final, jnp.float32)
    batched = jax.vmap(lambda *xs: ejk.gated_delta_rule(*(x[None] for x in xs), platform="xla")[0][0])
    assert_close(batched(q, k, v, g, beta), reference_gated_delta_rule(q, k, v, g, beta)[0], jnp.float32)


def test_no_final_state_unless_asked() -> None:
    q, k, v, g, beta, _ = gdr_inputs(GdrCase(batch=1, length=4, heads=1, dk=4, dv=4), jnp.float32)
    o, final = ejk.gated_delta_rule(q, k, v, g, beta, platform="xla")
    assert final is None and o.shape == (1, 4, 1, 4)
