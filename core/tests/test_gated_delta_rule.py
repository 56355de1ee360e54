"""``gated_delta_rule`` in the core alone: its validation, its reference (against a NumPy float64 loop)
and the one-token step."""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import GdrCase, assert_close, gdr_inputs, reference_gated_delta_rule


def numpy_loop(q: Any, k: Any, v: Any, g: Any, beta: Any, init: Any, cu: Any, scale: float,
               l2norm: bool) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence token by token in float64 NumPy, sequence by sequence."""
    q, k, v, g, beta = (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (q, k, v, g, beta))
    if l2norm:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    bounds = [(r, 0, t) for r in range(b)] if cu is None else [(0, int(s), int(e)) for s, e in itertools.pairwise(cu)]
    o = np.zeros((b, t, h, dv))
    finals = []
    for n, (row, start, end) in enumerate(bounds):
        state = np.zeros((h, dk, dv)) if init is None else np.asarray(init[n], np.float64).copy()
        for i in range(start, end):
            state *= np.exp(g[row, i])[:, None, None]
            u = beta[row, i][:, None] * (v[row, i] - np.einsum("hk,hkv->hv", k[row, i], state))
            state += k[row, i][:, :, None] * u[:, None, :]
            o[row, i] = scale * np.einsum("hk,hkv->hv", q[row, i], state)
        finals.append(state)
    return o, np.stack(finals)


@pytest.mark.parametrize("case", [
    GdrCase(batch=2, length=9, heads=2, dk=4, dv=3, initial_state=True),
    GdrCase(batch=1, length=12, heads=1, dk=3, dv=5, seqlens=(4, 0, 8), initial_state=True, l2norm=True),
    GdrCase(batch=1, length=0, heads=2, dk=4, dv=4, seqlens=(0, 0)),
], ids=str)
def test_the_reference_is_the_recurrence(case: GdrCase) -> None:
    q, k, v, g, beta, init = gdr_inputs(case, jnp.float32)
    cu = None if case.seqlens is None else np.concatenate([[0], np.cumsum(case.seqlens)]).astype(np.int32)
    o, final = reference_gated_delta_rule(q, k, v, g, beta, init, None if cu is None else jnp.asarray(cu),
                                          use_qk_l2norm=case.l2norm)
    want_o, want_final = numpy_loop(q, k, v, g, beta, init, cu, case.dk ** -0.5, case.l2norm)
    assert o.shape == want_o.shape and final.shape == want_final.shape and final.dtype == jnp.float32
    assert_close(o, want_o, jnp.float32, what="o")
    assert_close(final, want_final, jnp.float32, what="final state")


def test_the_step_is_one_token_of_the_reference() -> None:
    case = GdrCase(batch=3, length=1, heads=2, dk=8, dv=4, initial_state=True)
    q, k, v, g, beta, state = gdr_inputs(case, jnp.bfloat16)
    o, new = ejk.gated_delta_rule_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state, use_qk_l2norm=True)
    want_o, want_new = reference_gated_delta_rule(q, k, v, g, beta, state, use_qk_l2norm=True)
    assert (o.shape, o.dtype, new.shape, new.dtype) == ((3, 2, 4), jnp.bfloat16, (3, 2, 8, 4), jnp.float32)
    assert_close(o, want_o[:, 0], jnp.bfloat16)
    assert_close(new, want_new, jnp.float32)
    grads = jax.grad(lambda s: ejk.gated_delta_rule_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], s)[1].sum())
    assert np.isfinite(np.asarray(grads(state))).all()


def _args(**over: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "q": jax.ShapeDtypeStruct((1, 8, 2, 4), jnp.bfloat16), "k": jax.ShapeDtypeStruct((1, 8, 2, 4), jnp.bfloat16),
        "v": jax.ShapeDtypeStruct((1, 8, 2, 6), jnp.bfloat16), "g": jax.ShapeDtypeStruct((1, 8, 2), jnp.float32),
        "beta": jax.ShapeDtypeStruct((1, 8, 2), jnp.float32),
    }
    args.update(over)
    return args


def _normalize(**over: Any) -> Any:
    args = _args(**over)
    arrays = [args.pop(n) for n in ("q", "k", "v", "g", "beta")]
    return ejk.ops.get_op("gated_delta_rule").kernel.normalize(*arrays, **args)


@pytest.mark.parametrize(("over", "match"), [
    ({"q": jax.ShapeDtypeStruct((8, 2, 4), jnp.bfloat16)}, r"q has shape \(8, 2, 4\) but needs \[B, T, H, K\]"),
    ({"k": jax.ShapeDtypeStruct((1, 8, 2, 5), jnp.bfloat16)}, "k has shape .* but needs q's shape"),
    ({"v": jax.ShapeDtypeStruct((1, 8, 3, 6), jnp.bfloat16)}, "v has shape .* needs .*H=2, V"),
    ({"v": jax.ShapeDtypeStruct((1, 8, 2, 6), jnp.float32)}, "one common dtype"),
    ({"g": jax.ShapeDtypeStruct((1, 8), jnp.float32)}, r"g has shape \(1, 8\) but needs \[B=1, T=8, H=2\]"),
    ({"beta": jax.ShapeDtypeStruct((1, 8, 2), jnp.int32)}, "beta has dtype int32 but needs a floating dtype"),
    ({"initial_state": jax.ShapeDtypeStruct((1, 2, 6, 4), jnp.float32)},
     r"initial_state has shape \(1, 2, 6, 4\) but needs \[N=1, H=2, K=4, V=6\]"),
    ({"cu_seqlens": jnp.asarray([0, 3], jnp.int32)}, "cu_seqlens .* needs to start at 0 and end at T=8"),
    ({"cu_seqlens": jnp.asarray([0, 5, 4, 8], jnp.int32)}, r"cu_seqlens decreases at \[2\]"),
    ({"cu_seqlens": jnp.asarray([0.0, 8.0])}, "cu_seqlens has dtype float32 but needs an integer dtype"),
    ({"cu_seqlens": jnp.asarray([0, 8]), "initial_state": jax.ShapeDtypeStruct((2, 2, 4, 6), jnp.float32)},
     "one state per packed sequence"),
    ({"scale": float("nan")}, "scale is nan but needs a finite number"),
    ({"use_qk_l2norm": 1}, "use_qk_l2norm is 1 but needs True or False"),
    ({"output_final_state": "yes"}, "output_final_state is 'yes' but needs True or False"),
])
def test_bad_arguments_are_named(over: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=f"^gated_delta_rule: .*{match}"):
        _normalize(**over)


def test_packed_sequences_need_batch_one() -> None:
    q = jax.ShapeDtypeStruct((2, 8, 2, 4), jnp.bfloat16)
    with pytest.raises(ValueError, match="packed sequences need batch 1"):
        _normalize(q=q, k=q, v=jax.ShapeDtypeStruct((2, 8, 2, 6), jnp.bfloat16),
                   g=jax.ShapeDtypeStruct((2, 8, 2), jnp.float32), beta=jax.ShapeDtypeStruct((2, 8, 2), jnp.float32),
                   cu_seqlens=jnp.asarray([0, 8]))


def test_the_static_arguments_are_resolved() -> None:
    arrays, static = _normalize()
    assert static == {"scale": 0.5, "use_qk_l2norm": False}
    assert arrays[5:] == (None, None)


def test_the_step_names_its_bad_state() -> None:
    q = jnp.zeros((2, 3, 4))
    with pytest.raises(ValueError, match=r"gated_delta_rule_step: state has shape \(2, 3, 4, 4\) but needs"):
        ejk.gated_delta_rule_step(q, q, jnp.zeros((2, 3, 5)), jnp.zeros((2, 3)), jnp.zeros((2, 3)),
                                  jnp.zeros((2, 3, 4, 4)))


def _gdr_plan(layout: dict[int, tuple[tuple[str, ...], ...]], cu: bool = False, init: bool = True) -> Any:
    f32 = jnp.float32
    arrays = (jax.ShapeDtypeStruct((4, 16, 8, 4), f32), jax.ShapeDtypeStruct((4, 16, 8, 4), f32),
              jax.ShapeDtypeStruct((4, 16, 8, 6), f32), jax.ShapeDtypeStruct((4, 16, 8), f32),
              jax.ShapeDtypeStruct((4, 16, 8), f32),
              jax.ShapeDtypeStruct((3 if cu else 4, 8, 4, 6), f32) if init else None,
              jax.ShapeDtypeStruct((4,), jnp.int32) if cu else None)

    def axes_of(x: Any, dim: int) -> tuple[str, ...]:
        for i, spec in layout.items():
            if arrays[i] is x and dim < len(spec):
                return spec[dim]
        return ()

    return ejk.ops.get_op("gated_delta_rule").shard_rule_fn()(arrays, axes_of, lambda axes: 2 ** len(axes))


def test_the_shard_rule_splits_batch_rows_and_heads_only() -> None:
    from jax.sharding import PartitionSpec as P

    plan = _gdr_plan({0: (("x",), (), ("y",))})
    assert plan.in_specs[0] == P("x", None, "y", None) and plan.in_specs[3] == P("x", None, "y")
    assert plan.in_specs[5] == P("x", "y", None, None) and plan.in_specs[6] is None
    assert plan.out_specs == (P("x", None, "y", None), P("x", "y", None, None)) and plan.body is None
    packed = _gdr_plan({0: (("x",), (), ("y",))}, cu=True)  # packed sequences: heads only
    assert packed.in_specs[0] == P(None, None, "y", None) and packed.in_specs[6] == P(None)
    assert _gdr_plan({0: ((), ("x",))}) is None  # time is never split: gathered
