"""The Triton ``gla`` / ``ssd`` kernels (interpreted on a CPU) against the step-by-step references, values,
final states and gradients; configs; the gate; compilation for sm_90."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import assert_close, check_gla, check_ssd, reference_gla, reference_ssd
from ejk_triton import _env
from ejk_triton._linear_attention import (
    LinearAttentionConfig,
    capability,
    config_space,
    heuristic_config,
    ssd_config_space,
    ssd_heuristic_config,
)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_gla_conformance(dtype: Any) -> None:
    assert check_gla("triton", dtypes=(dtype,)) == 4


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_ssd_conformance(dtype: Any) -> None:
    assert check_ssd("triton", dtypes=(dtype,)) == 4


@pytest.mark.parametrize("state_blocks", [(16, 16), (32, 64)], ids=["narrow", "forward-wider"])
def test_a_config_with_several_column_blocks_and_odd_k(state_blocks: tuple[int, int]) -> None:
    rng = np.random.default_rng(0)
    q, k = (jnp.asarray(rng.standard_normal((1, 45, 1, 20)), jnp.float32) for _ in range(2))
    v = jnp.asarray(rng.standard_normal((1, 45, 1, 40)), jnp.float32)
    g = jax.nn.log_sigmoid(jnp.asarray(rng.standard_normal((1, 45, 1, 20)), jnp.float32) + 1.0)
    # several column blocks, K not a power of 2, two sub-blocks per chunk in the forward and the backward; the
    # forward's state tiles as the backward's, or wider (one block of all K, V)
    cfg = LinearAttentionConfig(chunk=32, state_block_k=state_blocks[0], state_block_v=state_blocks[1], block_k=16,
                                block_v=16, output_block_v=16, num_stages=1, backward_chunk=32)
    o, state = ejk.gla(q, k, v, g, output_final_state=True, platform="triton", cfg=cfg)
    want_o, want_state = reference_gla(q, k, v, g)
    assert_close(o, want_o, jnp.float32)
    assert_close(state, want_state, jnp.float32)
    cot = jnp.cos(v)

    def loss(fn: Any) -> Any:
        return lambda *a: (fn(*a)[0] * cot).sum()

    got = jax.grad(loss(lambda *a: ejk.gla(*a, platform="triton", cfg=cfg)), argnums=(0, 1, 2, 3))(q, k, v, g)
    want = jax.grad(loss(reference_gla), argnums=(0, 1, 2, 3))(q, k, v, g)
    for name, a, b in zip("qkvg", got, want, strict=True):
        assert_close(a, b, jnp.float32, what=f"d{name}")
    # ssd with the same tiles: state [N = 20, P = 40], two groups of B / C
    x = jnp.asarray(rng.standard_normal((1, 45, 2, 40)), jnp.float32)
    dt = jnp.asarray(rng.standard_normal((1, 45, 2)), jnp.float32) - 1.0
    a = -jnp.exp(jnp.asarray(rng.standard_normal(2), jnp.float32))
    bb, cc = (jnp.asarray(rng.standard_normal((1, 45, 2, 20)) * 0.3, jnp.float32) for _ in range(2))
    y, state = ejk.ssd(x, dt, a, bb, cc, dt_softplus=True, output_final_state=True, platform="triton", cfg=cfg)
    want_y, want_state = reference_ssd(x, dt, a, bb, cc, None, None, None, None, dt_softplus=True)
    assert_close(y, want_y, jnp.float32)
    assert_close(state, want_state, jnp.float32)
    got = jax.grad(lambda *z: (ejk.ssd(*z, dt_softplus=True, platform="triton", cfg=cfg)[0] * jnp.cos(x)).sum(),
                   argnums=(0, 1, 2, 3, 4))(x, dt, a, bb, cc)
    want = jax.grad(lambda *z: (reference_ssd(*z, None, None, None, None, dt_softplus=True)[0] * jnp.cos(x)).sum(),
                    argnums=(0, 1, 2, 3, 4))(x, dt, a, bb, cc)
    for name, a_got, a_want in zip(("x", "dt", "A", "B", "C"), got, want, strict=True):
        assert_close(a_got, a_want, jnp.float32, what=f"ssd d{name}")


def test_configs_and_gate() -> None:
    assert heuristic_config() in config_space()
    assert ssd_heuristic_config() in ssd_config_space()
    f64 = jax.ShapeDtypeStruct((1, 4, 1, 8), jnp.float64)
    assert "float64" in str(capability(f64, f64, f64, f64))
    wide = jax.ShapeDtypeStruct((1, 4, 1, 512), jnp.bfloat16)
    assert "at most 256" in str(capability(wide, wide, wide, wide))


def test_the_forward_state_tiles_widen_with_many_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU (132 SMs without one), 32 heads, K = V = N = P = 128: the forward state tiles [64, 64] at one
    sequence, doubled (gla: in V, then K; ssd: in N, then P) while they exceed one and a half programs per SM."""
    monkeypatch.setattr(_env, "interpret_mode", lambda: False)

    def sds(*shape: int, dtype: Any = jnp.bfloat16) -> Any:
        return jax.ShapeDtypeStruct(shape, dtype)

    def gla_tiles(batch: int, length: int, cu: Any = None, d: int = 128) -> tuple[int, int]:
        cfg = heuristic_config(q=sds(batch, length, 32, d), v=sds(batch, length, 32, d), cu_seqlens=cu)
        assert cfg in config_space(q=sds(batch, length, 32, d), v=sds(batch, length, 32, d), cu_seqlens=cu)
        return cfg.state_block_k, cfg.state_block_v

    def ssd_tiles(batch: int, length: int, cu: Any = None) -> tuple[int, int]:
        cfg = ssd_heuristic_config(x=sds(batch, length, 32, 128), B=sds(batch, length, 1, 128), cu_seqlens=cu)
        space = ssd_config_space(x=sds(batch, length, 32, 128), B=sds(batch, length, 1, 128), cu_seqlens=cu)
        assert space[0] == cfg and all((c.state_block_k, c.state_block_v) == (cfg.state_block_k, cfg.state_block_v)
                                       for c in space)
        return cfg.state_block_k, cfg.state_block_v

    packed = sds(9, dtype=jnp.int32)
    assert gla_tiles(1, 32768) == (64, 64)
    assert gla_tiles(2, 16384) == (64, 128)
    assert gla_tiles(4, 8192) == gla_tiles(8, 4096) == gla_tiles(1, 32768, packed) == (128, 128)
    assert gla_tiles(64, 512) == (128, 128)  # no wider than the state
    assert gla_tiles(8, 4096, d=32) == (64, 64)  # one tile of the whole state already
    assert ssd_tiles(1, 32768) == (64, 64)
    assert ssd_tiles(2, 16384) == (128, 64)
    assert ssd_tiles(4, 8192) == ssd_tiles(8, 4096) == ssd_tiles(1, 32768, packed) == (128, 128)


def test_the_kernel_compiles_for_sm90_at_qwen3_next_sizes(tmp_path: Any) -> None:
    """Compiled for sm_90 (PTX, then a cubin by the ptxas Triton ships) in a process without the
    interpreter: K = V = 128, the forward with per-channel and scalar gates (each also with the state tiles of
    many sequences, twice as wide), ``ssd``'s backward (bfloat16
    operands, float32 states, one group of ``B`` / ``C``, as it runs); shared memory within an H100's.
    ``gla``'s backward kernels take minutes to compile on a 2-core machine: they are compiled and run on the GPU
    host (``test_gpu_qwen3_next_like_layer``), or here with ``EJK_COMPILE_BACKWARD=1``."""
    backward = ", b(128, 128)['shared']" if os.environ.get("EJK_COMPILE_BACKWARD") == "1" else ""
    code = ("import jax.numpy as jnp; "
            "from ejk_triton._aot import compile_gla_backward as b, compile_linear_recurrence as c; "
            "from ejk_triton._linear_attention import LinearAttentionConfig as C; "
            "print(c(128, 128)['shared'], c(128, 128, scalar_gate=True, qk_heads=1)['shared'], "
            "c(128, 128, cfg=C(state_block_v=128))['shared'], "
            "c(128, 128, scalar_gate=True, qk_heads=1, cfg=C(state_block_k=128, state_block_v=128))['shared'], "
            f"b(128, 128, scalar_gate=True, qk_heads=1)['shared']{backward})")
    env = {k: v for k, v in os.environ.items() if k not in ("EJK_TRITON_INTERPRET", "TRITON_INTERPRET")}
    env.update(JAX_PLATFORMS="cpu", TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(0 < int(x) <= 227 * 1024 for x in done.stdout.split())


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_gpu_qwen3_next_like_layer(packed: bool) -> None:
    """K = V = 128, 4 heads, 2 x 1000 tokens (bfloat16), values, states and gradients against the float32
    reference; ssd the same size."""
    rng = np.random.default_rng(1)
    b, t = (1, 2000) if packed else (2, 1000)
    cu = jnp.asarray([0, 1000, 2000], jnp.int32) if packed else None
    q, k, v = (jnp.asarray(rng.standard_normal((b, t, 4, 128)) * 128 ** -0.5, jnp.bfloat16) for _ in range(3))
    g = jax.nn.log_sigmoid(jnp.asarray(rng.standard_normal((b, t, 4, 128)), jnp.float32) + 3.0)
    o, state = ejk.gla(q, k, v, g, cu_seqlens=cu, output_final_state=True, platform="triton")
    want_o, want_state = reference_gla(q, k, v, g, None, cu)
    assert_close(o, want_o, jnp.bfloat16)
    assert_close(state, want_state, jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((b, t, 4, 128)), jnp.bfloat16)
    dt = jnp.asarray(rng.standard_normal((b, t, 4)), jnp.float32) - 2.0
    a = -jnp.exp(jnp.asarray(rng.standard_normal(4), jnp.float32))
    bb, cc = (jnp.asarray(rng.standard_normal((b, t, 1, 128)) * 128 ** -0.5, jnp.bfloat16) for _ in range(2))
    y, state = ejk.ssd(x, dt, a, bb, cc, dt_softplus=True, cu_seqlens=cu, output_final_state=True, platform="triton")
    want_y, want_state = reference_ssd(x, dt, a, bb, cc, None, None, None, cu, dt_softplus=True)
    assert_close(y, want_y, jnp.bfloat16)
    assert_close(state, want_state, jnp.bfloat16)
    # Gradients of both (the backward kernels), against the float32 reference's.
    cot = jnp.asarray(rng.standard_normal(o.shape), jnp.float32)
    got = jax.grad(lambda *a: (ejk.gla(*a, cu_seqlens=cu, platform="triton")[0] * cot).sum(), argnums=(0, 1, 2, 3))(
        q, k, v, g)
    want = jax.grad(lambda *a: (reference_gla(*a, None, cu)[0] * cot).sum(), argnums=(0, 1, 2, 3))(q, k, v, g)
    for name, ours, ref in zip("qkvg", got, want, strict=True):
        assert_close(ours, ref, jnp.bfloat16, what=f"gla d{name}")
    got = jax.grad(lambda *a: (ejk.ssd(*a, dt_softplus=True, cu_seqlens=cu, platform="triton")[0] * cot).sum(),
                   argnums=(0, 1, 2, 3, 4))(x, dt, a, bb, cc)
    want = jax.grad(lambda *a: (reference_ssd(*a, None, None, None, cu, dt_softplus=True)[0] * cot).sum(),
                    argnums=(0, 1, 2, 3, 4))(x, dt, a, bb, cc)
    for name, ours, ref in zip(("x", "dt", "A", "B", "C"), got, want, strict=True):
        assert_close(ours, ref, jnp.bfloat16, what=f"ssd d{name}")


def _float64(fn: Any, args: tuple[Any, ...], cot: tuple[Any, Any]) -> tuple[Any, Any]:
    """``fn``'s outputs and the VJP of ``cot`` in float64 (the inputs widened exactly)."""
    with jax.enable_x64(True):
        wide = tuple(None if x is None else jnp.asarray(np.asarray(x, np.float64)) for x in args)
        out, pull = jax.vjp(fn, *wide)
        grads = pull(tuple(jnp.asarray(np.asarray(c, np.float64)) for c in cot))
        return tuple(np.asarray(o) for o in out), tuple(np.asarray(x) for x in grads)


@pytest.mark.parametrize("chunk", [32, 64])
def test_gla_phases_against_float64(chunk: int) -> None:
    """Chunks of 32 tokens (two sub-blocks) or 64 (four) forward and backward, sequences of 0, 1, 18 (one
    partial chunk) and 34 (crossing a 32-token chunk) tokens, initial states: values, final states, every
    gradient."""
    rng = np.random.default_rng(5)
    cu = (0, 0, 1, 19, 19, 53)
    b, t, n = 1, 53, len(cu) - 1
    cu_seqlens = jnp.asarray(cu, jnp.int32)
    q, k = (jnp.asarray(rng.standard_normal((b, t, 1, 16)), jnp.float32) for _ in range(2))
    v = jnp.asarray(rng.standard_normal((b, t, 1, 16)), jnp.float32)
    g = jax.nn.log_sigmoid(jnp.asarray(rng.standard_normal((b, t, 1, 16)), jnp.float32) + 1.0)
    s0 = jnp.asarray(rng.standard_normal((n, 1, 16, 16)), jnp.float32)
    cot = (jnp.asarray(rng.standard_normal(v.shape), jnp.float32), jnp.asarray(rng.standard_normal(s0.shape),
                                                                                 jnp.float32))
    cfg = LinearAttentionConfig(chunk=chunk, block_k=16, block_v=16, output_block_v=16, num_stages=1,
                                backward_chunk=chunk)

    def ours(*a: Any) -> Any:
        return ejk.gla(*a[:4], initial_state=a[4], cu_seqlens=cu_seqlens, output_final_state=True,
                       platform="triton", cfg=cfg)

    got, pull = jax.vjp(ours, q, k, v, g, s0)
    (want_o, want_s), want_grads = _float64(lambda *a: reference_gla(*a, cu_seqlens), (q, k, v, g, s0), cot)
    assert_close(got[0], want_o, jnp.float32, what="o")
    assert_close(got[1], want_s, jnp.float32, what="final state")
    for name, a, w in zip(("q", "k", "v", "g", "initial_state"), pull(cot), want_grads, strict=True):
        assert_close(a, w, jnp.float32, what=f"d{name}")


@pytest.mark.parametrize(("backward_chunk", "p", "n"), [(16, 8, 16), (32, 20, 40)])
def test_ssd_phases_against_float64(backward_chunk: int, p: int, n: int) -> None:
    """``ssd`` in chunks of 32 (16 or 32 in the backward; one or several K and V blocks; grouped B / C, packed
    with an empty sequence, initial states): values, final states, every gradient."""
    rng = np.random.default_rng(6)
    cu_seqlens = jnp.asarray([0, 35, 35, 41], jnp.int32)
    x = jnp.asarray(rng.standard_normal((1, 41, 2, p)), jnp.float32)
    dt = jnp.asarray(rng.standard_normal((1, 41, 2)), jnp.float32)
    a = -jnp.exp(jnp.asarray(rng.standard_normal(2), jnp.float32))
    bb, cc = (jnp.asarray(rng.standard_normal((1, 41, 1, n)), jnp.float32) for _ in range(2))
    s0 = jnp.asarray(rng.standard_normal((3, 2, p, n)), jnp.float32)
    cot = (jnp.asarray(rng.standard_normal(x.shape), jnp.float32), jnp.asarray(rng.standard_normal(s0.shape),
                                                                                 jnp.float32))
    cfg = LinearAttentionConfig(chunk=32, block_k=16, block_v=16, num_stages=1, backward_chunk=backward_chunk)

    def ours(*args: Any) -> Any:
        return ejk.ssd(*args[:5], initial_state=args[5], cu_seqlens=cu_seqlens, dt_softplus=True,
                       output_final_state=True, platform="triton", cfg=cfg)

    def ref(*args: Any) -> Any:
        return reference_ssd(*args[:5], None, None, args[5], cu_seqlens, dt_softplus=True)

    got, pull = jax.vjp(ours, x, dt, a, bb, cc, s0)
    (want_y, want_s), want_grads = _float64(ref, (x, dt, a, bb, cc, s0), cot)
    assert_close(got[0], want_y, jnp.float32, what="y")
    assert_close(got[1], want_s, jnp.float32, what="final state")
    for name, mine, w in zip(("x", "dt", "A", "B", "C", "initial_state"), pull(cot), want_grads, strict=True):
        assert_close(mine, w, jnp.float32, what=f"d{name}")
