"""ejk-xla's chunked ``gla`` and ``ssd`` against float64 step-by-step references: values, final states
and every gradient; odd lengths, packed and empty sequences, decoding, long sequences, bad input."""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import enable_x64

import ejk
from ejk.testing import assert_close, check_gla, check_ssd, reference_gla, reference_ssd
from ejk_xla._gla import GlaConfig
from ejk_xla._ssd import SsdConfig

pytestmark = pytest.mark.filterwarnings("error")

F32 = jnp.float32


def gla_inputs(seed: int, b: int, t: int, h: int, dk: int, dv: int, states: int | None = None,
               gate_shift: float = 2.0) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((b, t, h, dk), np.float32) for _ in range(2))
    v = rng.standard_normal((b, t, h, dv), np.float32)
    g = np.asarray(jax.nn.log_sigmoid(rng.standard_normal((b, t, h, dk), np.float32) + gate_shift))
    s = None if states is None else rng.standard_normal((states, h, dk, dv), np.float32)
    return q, k, v, g, s


def ssd_inputs(seed: int, b: int, t: int, h: int, p: int, groups: int, n: int,
               states: int | None = None) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, t, h, p), np.float32)
    dt = rng.standard_normal((b, t, h), np.float32) - 1.0
    a = -np.exp(rng.standard_normal(h).astype(np.float32))
    bb, cc = (rng.standard_normal((b, t, groups, n), np.float32) for _ in range(2))
    d, bias = rng.standard_normal(h).astype(np.float32), 0.5 * rng.standard_normal(h).astype(np.float32)
    s = None if states is None else rng.standard_normal((states, h, p, n), np.float32)
    return x, dt, a, bb, cc, d, bias, s


def values_and_grads(fn: Any, args: tuple[Any, ...], seed: int = 3) -> tuple[Any, Any]:
    """``fn(*args)`` (an output and a state) and the gradients of every non-``None`` argument."""
    live = [i for i, x in enumerate(args) if x is not None]

    def of_live(*xs: Any) -> Any:
        merged = list(args)
        for i, x in zip(live, xs, strict=True):
            merged[i] = x
        return tuple(fn(*merged))

    out, vjp = jax.vjp(of_live, *(args[i] for i in live))
    rng = np.random.default_rng(seed)
    ct = tuple(jnp.asarray(rng.standard_normal(o.shape), o.dtype) for o in out)
    return out, vjp(ct)


def against_float64(ours: Any, ref: Any, args: tuple[Any, ...], label: str) -> None:
    """``ours`` on float32 inputs against ``ref`` on the same inputs in float64: outputs, states, gradients."""
    got, got_grads = jax.jit(lambda *a: values_and_grads(ours, a))(*(None if a is None else jnp.asarray(a, F32)
                                                                     for a in args))
    with enable_x64():
        want, want_grads = values_and_grads(ref, tuple(None if a is None else jnp.asarray(a, jnp.float64)
                                                       for a in args))
        want, want_grads = jax.tree.map(np.asarray, (want, want_grads))
    assert_close(got[0], want[0], F32, what=f"{label} output")
    assert_close(got[1], want[1], F32, what=f"{label} final state")
    for i, (g, w) in enumerate(zip(got_grads, want_grads, strict=True)):
        assert_close(g, w, F32, what=f"{label} gradient {i}")


# -- the conformance checks every platform runs ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_gla_conformance(dtype: Any) -> None:
    assert check_gla("xla", dtypes=(dtype,)) == 4


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_ssd_conformance(dtype: Any) -> None:
    assert check_ssd("xla", dtypes=(dtype,)) == 4


# -- float64 references ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("t", "chunk", "cu"), [(29, 8, None), (24, 8, (0, 0, 8, 8, 11, 24))],
                         ids=["odd", "packed-with-empty"])
def test_gla_against_float64_reference(t: int, chunk: int, cu: tuple[int, ...] | None) -> None:
    b = 2 if cu is None else 1
    states = b if cu is None else len(cu) - 1
    cu_seqlens = None if cu is None else jnp.asarray(cu, jnp.int32)
    args = gla_inputs(0, b, t, 2, 8, 4, states)

    def ours(q: Any, k: Any, v: Any, g: Any, s: Any) -> Any:
        return ejk.gla(q, k, v, g, initial_state=s, output_final_state=True, cu_seqlens=cu_seqlens,
                       platform="xla", cfg=GlaConfig(chunk=chunk), scale=0.7)

    def ref(q: Any, k: Any, v: Any, g: Any, s: Any) -> Any:
        return reference_gla(q, k, v, g, s, cu_seqlens, scale=0.7)

    against_float64(ours, ref, args, f"gla T={t} cu={cu}")


@pytest.mark.parametrize(("t", "chunk", "cu", "softplus"), [(29, 8, None, True), (24, 4, (0, 0, 8, 8, 11, 24), False)],
                         ids=["odd", "packed-with-empty"])
def test_ssd_against_float64_reference(t: int, chunk: int, cu: tuple[int, ...] | None, softplus: bool) -> None:
    b = 2 if cu is None else 1
    states = b if cu is None else len(cu) - 1
    cu_seqlens = None if cu is None else jnp.asarray(cu, jnp.int32)
    x, dt, a, bb, cc, d, bias, s = ssd_inputs(1, b, t, 4, 4, 2, 8, states)
    if not softplus:
        dt = np.abs(dt) * 0.3

    def ours(*args: Any) -> Any:
        x, dt, a, bb, cc, d, bias, s = args
        return ejk.ssd(x, dt, a, bb, cc, D=d, dt_bias=bias, dt_softplus=softplus, initial_state=s,
                       output_final_state=True, cu_seqlens=cu_seqlens, platform="xla", cfg=SsdConfig(chunk=chunk))

    def ref(*args: Any) -> Any:
        return reference_ssd(*args, cu_seqlens, dt_softplus=softplus)

    against_float64(ours, ref, (x, dt, a, bb, cc, d, bias, s), f"ssd T={t} cu={cu}")


# -- the references themselves, against a plain NumPy loop ------------------------------------------------------


def test_references_follow_the_documented_recurrences() -> None:
    q, k, v, g, s = gla_inputs(2, 1, 6, 2, 3, 2, 2)
    cu = np.asarray([0, 4, 6])
    want_o, want_s = np.zeros((1, 6, 2, 2)), np.zeros((2, 2, 3, 2))
    for n in range(2):
        state = s[n].astype(np.float64)
        for t in range(cu[n], cu[n + 1]):
            state = np.exp(g[0, t])[..., None] * state + k[0, t][..., :, None] * v[0, t][..., None, :]
            want_o[0, t] = 0.5 * np.einsum("hk,hkv->hv", q[0, t], state)
        want_s[n] = state
    o, fin = reference_gla(*map(jnp.asarray, (q, k, v, g, s)), jnp.asarray(cu), scale=0.5)
    assert_close(o, want_o, F32)
    assert_close(fin, want_s, F32)

    x, dt, a, bb, cc, d, bias, s = ssd_inputs(3, 1, 5, 4, 2, 2, 3, 1)
    state = s[0].astype(np.float64)
    want_y = np.zeros((1, 5, 4, 2))
    for t in range(5):
        step = np.log1p(np.exp(dt[0, t] + bias))
        for h in range(4):
            grp = h // 2
            state[h] = np.exp(step[h] * a[h]) * state[h] + step[h] * np.outer(x[0, t, h], bb[0, t, grp])
            want_y[0, t, h] = state[h] @ cc[0, t, grp] + d[h] * x[0, t, h]
    y, fin = reference_ssd(*map(jnp.asarray, (x, dt, a, bb, cc, d, bias, s)), dt_softplus=True)
    assert_close(y, want_y, F32)
    assert_close(fin[0], state, F32)


# -- edge cases -------------------------------------------------------------------------------------------------


def test_empty_inputs_return_the_initial_states() -> None:
    q, k, v, g, s = gla_inputs(4, 2, 0, 2, 4, 3, 2)
    o, fin = ejk.gla(q, k, v, g, initial_state=s, output_final_state=True, platform="xla")
    assert o.shape == (2, 0, 2, 3)
    np.testing.assert_array_equal(fin, s)
    x, dt, a, bb, cc, _, _, s = ssd_inputs(4, 1, 0, 2, 4, 1, 3, 3)
    y, fin = ejk.ssd(x, dt, a, bb, cc, initial_state=s, output_final_state=True, platform="xla",
                     cu_seqlens=jnp.zeros(4, jnp.int32))
    assert y.shape == (1, 0, 2, 4)
    np.testing.assert_array_equal(fin, s)


def test_packed_sequences_equal_separate_calls_under_jit() -> None:
    lens = (7, 0, 12, 1)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    q, k, v, g, s = gla_inputs(5, 1, int(cu[-1]), 2, 4, 4, len(lens))
    run = jax.jit(lambda *a: ejk.gla(*a[:4], initial_state=a[4], cu_seqlens=a[5], output_final_state=True,
                                     platform="xla", cfg=GlaConfig(chunk=4)))
    o, fin = run(q, k, v, g, s, cu)  # cu_seqlens traced
    for n, (lo, hi) in enumerate(itertools.pairwise(cu)):
        part = [x[:, lo:hi] for x in (q, k, v, g)]
        o_n, fin_n = ejk.gla(*part, initial_state=s[n:n + 1], output_final_state=True, platform="xla")
        assert_close(o[:, lo:hi], o_n, F32, what=f"sequence {n} output")
        assert_close(fin[n:n + 1], fin_n, F32, what=f"sequence {n} state")


def test_decoding_token_by_token_continues_a_prefill() -> None:
    q, k, v, g, _ = gla_inputs(6, 2, 11, 2, 4, 4)
    full, fin = ejk.gla(q, k, v, g, output_final_state=True, platform="xla")
    o, state = ejk.gla(q[:, :7], k[:, :7], v[:, :7], g[:, :7], output_final_state=True, platform="xla")
    steps = [o]
    for t in range(7, 11):
        o_t, state = ejk.gla(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], initial_state=state,
                             output_final_state=True, platform="xla")
        steps.append(o_t)
    assert_close(jnp.concatenate(steps, axis=1), full, F32)
    assert_close(state, fin, F32)

    x, dt, a, bb, cc, d, bias, _ = ssd_inputs(6, 1, 9, 2, 4, 1, 4)
    opts = {"D": d, "dt_bias": bias, "dt_softplus": True, "output_final_state": True, "platform": "xla"}
    full, fin = ejk.ssd(x, dt, a, bb, cc, **opts)
    y, state = ejk.ssd(x[:, :5], dt[:, :5], a, bb[:, :5], cc[:, :5], **opts)
    steps = [y]
    for t in range(5, 9):
        y_t, state = ejk.ssd(x[:, t:t + 1], dt[:, t:t + 1], a, bb[:, t:t + 1], cc[:, t:t + 1], initial_state=state,
                             **opts)
        steps.append(y_t)
    assert_close(jnp.concatenate(steps, axis=1), full, F32)
    assert_close(state, fin, F32)


@pytest.mark.parametrize("gate_shift", [4.0, -6.0], ids=["slow-decay", "fast-decay"])
def test_gla_long_sequence_is_stable(gate_shift: float) -> None:
    """2k tokens: slow gates (the state sums many tokens) and fast ones (log gates near -6, whose running
    sums inside a chunk reach -400: nothing overflows)."""
    q, k, v, g, _ = gla_inputs(7, 1, 2048, 1, 8, 8, gate_shift=gate_shift)
    o, fin = jax.jit(lambda *a: ejk.gla(*a, output_final_state=True, platform="xla"))(q, k, v, g)
    want_o, want_s = jax.jit(reference_gla)(*map(jnp.asarray, (q, k, v, g)))
    assert np.isfinite(np.asarray(o)).all() and np.isfinite(np.asarray(fin)).all()
    assert_close(o, want_o, F32, what="output")
    assert_close(fin, want_s, F32, what="state")


def test_ssd_long_sequence_is_stable() -> None:
    x, dt, a, bb, cc, d, bias, _ = ssd_inputs(8, 1, 4096, 2, 4, 1, 8)
    run = jax.jit(lambda *a: ejk.ssd(*a[:5], D=a[5], dt_bias=a[6], dt_softplus=True, output_final_state=True,
                                     platform="xla"))
    y, fin = run(x, dt, a, bb, cc, d, bias)
    want_y, want_s = jax.jit(lambda *a: reference_ssd(*a, dt_softplus=True))(x, dt, a, bb, cc, d, bias)
    assert np.isfinite(np.asarray(y)).all()
    assert_close(y, want_y, F32, what="output")
    assert_close(fin, want_s, F32, what="state")


# -- bad input ------------------------------------------------------------------------------------------------


def _gla(**over: Any) -> Any:
    q, k, v, g, _ = gla_inputs(9, 1, 4, 2, 4, 3)
    args = {"q": q, "k": k, "v": v, "g": g, **over}
    arrays = [args.pop(n) for n in ("q", "k", "v", "g")]
    return lambda: ejk.gla(*arrays, **args)


def _ssd(**over: Any) -> Any:
    x, dt, a, bb, cc, *_ = ssd_inputs(9, 1, 4, 4, 2, 2, 3)
    args = {"x": x, "dt": dt, "A": a, "B": bb, "C": cc, **over}
    arrays = [args.pop(n) for n in ("x", "dt", "A", "B", "C")]
    return lambda: ejk.ssd(*arrays, **args)


@pytest.mark.parametrize(("call", "match"), [
    (_gla(k=np.zeros((1, 4, 2, 5), np.float32)), "gla: k has shape"),
    (_gla(v=np.zeros((1, 3, 2, 3), np.float32)), "gla: v has shape"),
    (_gla(v=jnp.zeros((1, 4, 2, 3), jnp.bfloat16)), "need one dtype"),
    (_gla(scale=0.0), "gla: scale"),
    (_gla(cu_seqlens=np.asarray([0, 3, 2, 4], np.int32)), "non-decreasing"),
    (_gla(cu_seqlens=np.asarray([0, 3], np.int32)), "end at T=4"),
    (_gla(cu_seqlens=np.asarray([0.0, 4.0], np.float32)), "cu_seqlens has dtype"),
    (_gla(initial_state=np.zeros((2, 2, 4, 3), np.float32)), r"initial_state has shape \(2, 2, 4, 3\)"),
    (_ssd(B=np.zeros((1, 4, 3, 3), np.float32), C=np.zeros((1, 4, 3, 3), np.float32)), "divides the H=4 heads"),
    (_ssd(C=np.zeros((1, 4, 2, 2), np.float32)), "ssd: C has shape"),
    (_ssd(A=np.zeros(3, np.float32)), "ssd: A has shape"),
    (_ssd(dt=np.zeros((1, 4, 2), np.float32)), "ssd: dt has shape"),
    (_ssd(D=np.zeros(2, np.float32)), "ssd: D has shape"),
    (_ssd(dt_softplus=1), "dt_softplus"),
    (_ssd(x=np.zeros((2, 4, 4, 2), np.float32), dt=np.zeros((2, 4, 4), np.float32),
          B=np.zeros((2, 4, 2, 3), np.float32), C=np.zeros((2, 4, 2, 3), np.float32),
          cu_seqlens=np.asarray([0, 4], np.int32)), "batch size is 2"),
])
def test_bad_input_names_the_argument(call: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_vmap_over_an_extra_axis() -> None:
    q, k, v, g, s = gla_inputs(10, 3, 6, 2, 4, 4, 3)  # the batch axis mapped: each call sees B = 1
    run = jax.vmap(lambda *a: ejk.gla(*(x[None] for x in a[:4]), initial_state=a[4][None], output_final_state=True,
                                      platform="xla"))
    o, fin = run(q, k, v, g, s)
    want_o, want_s = reference_gla(*map(jnp.asarray, (q, k, v, g, s)))
    assert_close(o[:, 0], want_o, F32)
    assert_close(fin[:, 0], want_s, F32)


def test_the_ssd_bench_baseline_computes_ssd() -> None:
    """``ejk bench``'s ``mamba2 chunked (jnp)`` baseline (the paper's layout, no ejk code) is the same op."""
    from ejk.bench import mamba2_chunked

    x, dt, a, bb, cc, d, bias, _ = ssd_inputs(11, 2, 32, 4, 4, 2, 8)
    y = jax.jit(lambda *args: mamba2_chunked(*args, chunk=8))(x, dt, a, bb, cc, d, bias)
    want, _ = reference_ssd(*map(jnp.asarray, (x, dt, a, bb, cc, d, bias)), dt_softplus=True)
    assert_close(y, want, F32)
