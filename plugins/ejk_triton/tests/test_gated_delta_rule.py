"""The Triton gated delta rule against a float64 step-by-step reference: values, final states and the
gradients of every input, odd lengths, packed sequences with empty ones, vmap and the gate.

On a CPU the kernels run through Triton's interpreter (tiny shapes); tests marked ``gpu`` run
Qwen3-Next-sized heads compiled on an NVIDIA GPU against the float64 reference there (Triton 3.4 to
3.7.0 miscompile a gated chunk backward of this family on Hopper: the GPU result is what counts).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import FAST_COMPILE, GdrCase, assert_close, gdr_inputs, reference_gated_delta_rule
from ejk_triton import _env
from ejk_triton._gated_delta_rule import _FLOAT32, GatedDeltaRuleConfig, _l2, capability, config_space, heuristic_config

ON_GPU = _env.nvidia_gpu()[0]
needs_kernels = pytest.mark.skipif(not (ON_GPU or _env.interpret_mode()),
                                   reason="needs an NVIDIA GPU or EJK_TRITON_INTERPRET=1")
SMALL = GatedDeltaRuleConfig(chunk=16, block_v=16, num_warps=4, num_stages=1, backward_chunk=16)
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

    return jax.jit(both, compiler_options=None if ON_GPU else FAST_COMPILE)(*args)


def float64_reference(case: GdrCase, args: tuple[jax.Array, ...]) -> tuple[Any, Any]:
    with jax.enable_x64(True):
        wide = tuple(jnp.asarray(np.asarray(jnp.asarray(x, jnp.float32)), jnp.float64) for x in args)
        cu = _cu(case)

        def ref(*xs: jax.Array) -> tuple[jax.Array, jax.Array]:
            return reference_gated_delta_rule(*xs[:5], xs[5] if len(xs) > 5 else None, cu, use_qk_l2norm=case.l2norm)

        (o, final), grads = outputs_and_grads(ref, wide)
        return (np.asarray(o), np.asarray(final)), [np.asarray(x) for x in grads]


def check_case(case: GdrCase, dtype: Any, cfg: Any, *, seed: int = 0, kind: str | None = None) -> None:
    *arrays, init = gdr_inputs(case, dtype, seed)
    args = (*arrays, *(() if init is None else (init,)))
    cu = _cu(case)

    def ours(*xs: jax.Array) -> tuple[jax.Array, jax.Array]:
        o, final = ejk.gated_delta_rule(*xs[:5], initial_state=xs[5] if len(xs) > 5 else None, cu_seqlens=cu,
                                        use_qk_l2norm=case.l2norm, output_final_state=True, platform="triton",
                                        cfg=cfg)
        return o, final

    (o, final), grads = outputs_and_grads(ours, args)
    (want_o, want_final), want_grads = float64_reference(case, args)
    assert o.dtype == dtype and final.dtype == jnp.float32
    assert_close(o, want_o, dtype, what="o", kind=kind)
    assert_close(final, want_final, dtype, what="final state", kind=kind)
    for name, got, want, x in zip(NAMES, grads, want_grads, args, strict=True):
        assert got.shape == x.shape and got.dtype == x.dtype, name
        assert_close(got, want, dtype, what=f"d{name}", kind=kind)


@needs_kernels
@pytest.mark.parametrize("case", [
    GdrCase(batch=2, length=37, heads=1, dk=16, dv=16, initial_state=True),  # odd: a padded last chunk, 3 chunks
    GdrCase(batch=1, length=45, heads=1, dk=16, dv=24, seqlens=(0, 18, 3, 0, 24), initial_state=True, l2norm=True),
], ids=str)
def test_values_states_and_gradients_match_float64(case: GdrCase) -> None:
    check_case(case, jnp.float32, SMALL)


@needs_kernels
def test_the_backward_splits_the_forward_chunks() -> None:
    """A 32-token forward layout, the backward kernels in 16-token chunks (the GPU heuristic's 64 / 32)."""
    check_case(GdrCase(batch=1, length=40, heads=1, dk=16, dv=16, seqlens=(35, 5), initial_state=True),
               jnp.float32, GatedDeltaRuleConfig(chunk=32, block_v=16, num_warps=4, num_stages=1, backward_chunk=16))


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_sixty_four_token_chunks(dtype: Any) -> None:
    """The GPU heuristic's 64-token chunk: its inverse from four 16-token blocks (and a padded last chunk)."""
    check_case(GdrCase(batch=1, length=100, heads=1, dk=16, dv=16, initial_state=True, l2norm=True), dtype,
               GatedDeltaRuleConfig(chunk=64, block_v=16, output_block_v=16, num_warps=4, num_stages=1,
                                    backward_chunk=16))


@needs_kernels
def test_k_is_split_into_blocks() -> None:
    """K in blocks of 16: the state kernel's two halves, the output kernel's two steps, and the backward's
    ``dq`` / ``dk`` / ``dW`` in two blocks, whose ``gc`` gradients add up (the float32 GPU heuristic's case)."""
    check_case(GdrCase(batch=1, length=40, heads=2, dk=32, dv=16, seqlens=(23, 17), initial_state=True),
               jnp.float32, GatedDeltaRuleConfig(chunk=16, state_block_v=16, output_block_v=16, output_block_k=16,
                                                 num_warps=4, num_stages=1, backward_chunk=16, block_v=16,
                                                 backward_block_k=16))


@needs_kernels
def test_bfloat16_inputs() -> None:
    check_case(GdrCase(batch=1, length=20, heads=1, dk=16, dv=16, initial_state=True, l2norm=True), jnp.bfloat16, SMALL)


@needs_kernels
def test_empty_and_single_token_calls() -> None:
    q, k, v, g, beta, init = gdr_inputs(GdrCase(batch=1, length=0, heads=1, dk=16, dv=16, seqlens=(0, 0),
                                                initial_state=True), jnp.float32)
    o, final = ejk.gated_delta_rule(q, k, v, g, beta, initial_state=init, cu_seqlens=jnp.asarray([0, 0, 0]),
                                    output_final_state=True, platform="triton", cfg=SMALL)
    assert o.shape == (1, 0, 1, 16) and np.array_equal(final, init)
    q, k, v, g, beta, init = gdr_inputs(GdrCase(batch=1, length=1, heads=1, dk=16, dv=16, initial_state=True),
                                        jnp.float32)
    o, final = ejk.gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True,
                                    platform="triton", cfg=SMALL)
    want_o, want_final = ejk.gated_delta_rule_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], init)
    assert_close(o[:, 0], want_o, jnp.float32)
    assert_close(final, want_final, jnp.float32)


@needs_kernels
def test_vmap_runs_each_element() -> None:
    q, k, v, g, beta, _ = gdr_inputs(GdrCase(batch=2, length=16, heads=1, dk=16, dv=16), jnp.float32)
    batched = jax.vmap(lambda *xs: ejk.gated_delta_rule(*(x[None] for x in xs), platform="triton", cfg=SMALL)[0][0])
    assert_close(batched(q, k, v, g, beta), reference_gated_delta_rule(q, k, v, g, beta)[0], jnp.float32)


@needs_kernels
@pytest.mark.parametrize("width", [16, 48, 256])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_l2_norm_kernels_against_float64(width: int, dtype: Any) -> None:
    """``use_qk_l2norm``'s row kernels (rows not a multiple of a block, widths not a power of two, a zero row):
    values and gradient against the float64 expression."""
    x = jax.random.normal(jax.random.key(0), (3, 7, 2, width), jnp.float32).at[1, 2, 0].set(0.0).astype(dtype)
    ct = jax.random.normal(jax.random.key(1), x.shape, jnp.float32).astype(dtype)

    def want(x: Any) -> Any:
        return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)

    x64, ct64 = np.asarray(x, np.float64), np.asarray(ct, np.float64)
    got, vjp = jax.vjp(_l2, x)
    assert got.dtype == x.dtype
    assert_close(got, want(x64), dtype)
    y = want(x64)
    r = 1.0 / np.sqrt(np.sum(x64 * x64, axis=-1, keepdims=True) + 1e-6)
    assert_close(vjp(ct)[0], r * (ct64 - y * np.sum(y * ct64, axis=-1, keepdims=True)), dtype, what="dx")


_AOT_SCRIPT = """
import json, jax, jax.numpy as jnp
from ejk_triton._gated_delta_rule import compile_kernels, heuristic_config
shared = {}
for dtype in (jnp.bfloat16, jnp.float32):
    cfg = heuristic_config(jax.ShapeDtypeStruct((1, 8, 32, 128), dtype))
    report = compile_kernels(128, 128, dtype, cfg=cfg)
    shared.update({f"{name} {jnp.dtype(dtype).name}": info["shared"] for name, info in report.items()})
many = jax.ShapeDtypeStruct((8, 4096, 32, 128), jnp.bfloat16)  # the state kernel's wider V blocks
cfg = heuristic_config(many, many)
assert cfg.state_block_v == 64, cfg
shared["gdr_state_kernel wide"] = compile_kernels(128, 128, jnp.bfloat16, cfg=cfg)["state"]["shared"]
print(json.dumps(shared))
"""


def test_kernels_compile_for_sm90_without_a_gpu(compile_report: Any) -> None:
    """Every kernel of a forward and a backward compiles for sm_90 at K = V = 128 with the GPU heuristic's config
    for bfloat16 and float32 inputs and fits an H100's shared memory (the interpreter runs what the compiler may
    refuse)."""
    shared = compile_report(_AOT_SCRIPT, timeout=600)
    assert len(shared) == 19 and all(0 < size <= 227 * 1024 for size in shared.values()), shared


def test_a_backward_chunk_above_the_forward_chunk_is_refused() -> None:
    with pytest.raises(ValueError, match="backward_chunk=64 but needs at most chunk=32"):
        GatedDeltaRuleConfig(chunk=32, backward_chunk=64)


def test_the_gate_names_what_it_cannot_run() -> None:
    big = jax.ShapeDtypeStruct((1, 8, 2, 512), jnp.bfloat16)
    gate = jax.ShapeDtypeStruct((1, 8, 2), jnp.float32)
    assert "K and V up to 256" in (capability(big, big, big, gate, gate) or "")


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("case", [
    GdrCase(batch=2, length=1000, heads=4, dk=128, dv=128, initial_state=True, l2norm=True),
    GdrCase(batch=1, length=3000, heads=4, dk=128, dv=128, seqlens=(1000, 0, 1, 1999), initial_state=True,
            l2norm=True),
], ids=str)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_on_the_gpu_against_float64(case: GdrCase, dtype: Any) -> None:
    """Qwen3-Next-sized heads, the heuristic's config, compiled: values, states and every gradient."""
    check_case(case, dtype, None, kind="gpu")


def test_long_sequences_are_accepted() -> None:
    """The kernels index with int64: 32k (and 1M) tokens of 32 heads of 128 x 128 states pass the gate."""
    for tokens in (32768, 1 << 20):
        qk = jax.ShapeDtypeStruct((1, tokens, 32, 128), jnp.bfloat16)
        gate = jax.ShapeDtypeStruct((1, tokens, 32), jnp.float32)
        reason = capability(qk, qk, qk, gate, gate)
        assert reason is None or "GPU" in reason, reason


def test_the_state_kernel_widens_with_many_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU (132 SMs without one), 32 heads, V = 128: the forward state kernel's V blocks of 32 at one
    sequence, 64 from two (batched or packed), never wider than V; float32 keeps its tiles."""
    monkeypatch.setattr(_env, "interpret_mode", lambda: False)

    def block(batch: int, length: int, dv: int = 128, cu: Any = None, dtype: Any = jnp.bfloat16) -> int:
        q = jax.ShapeDtypeStruct((batch, length, 32, 128), dtype)
        v = jax.ShapeDtypeStruct((batch, length, 32, dv), dtype)
        cfg = heuristic_config(q, v, cu)
        assert config_space(q, v, cu)[0] == cfg
        return cfg.state_block_v

    assert block(1, 32768) == 32
    assert block(2, 16384) == block(4, 8192) == block(8, 4096) == 64
    assert block(1, 32768, cu=jax.ShapeDtypeStruct((9,), jnp.int32)) == block(64, 512) == 64
    assert block(64, 512, dv=32) == 32
    assert block(8, 4096, dtype=jnp.float32) == _FLOAT32.state_block_v
