"""The Triton RMSNorm against float64 and the op's conformance check: widths, dtypes, gradients, pairing.

On a CPU the kernels run through Triton's interpreter (``EJK_TRITON_INTERPRET=1``, see conftest.py):
the backward's persistent grid has 3 programs there, so every case with more than 3 row blocks
walks several; :data:`TWO_PASS` forces the wide-row path (16-column steps) on tiny widths.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import assert_close, check_rms_norm, reference_rms_norm
from ejk_triton import _env
from ejk_triton._rms_norm import RmsNormConfig, capability, config_space, heuristic_config

pytestmark = [pytest.mark.filterwarnings("error"),
              pytest.mark.skipif(not (_env.nvidia_gpu()[0] or _env.interpret_mode()),
                                 reason="needs an NVIDIA GPU or EJK_TRITON_INTERPRET=1")]

#: Two rows per step, 16 columns per step in both kernels (rows wider than 16 take two passes), one
#: backward program per SM.
TWO_PASS = RmsNormConfig(block_rows=2, block_d=16, num_warps=4, bwd_block_d=16, bwd_num_warps=4, programs_per_sm=1)


def _float64_oracle(x: np.ndarray, scale: np.ndarray, residual: np.ndarray | None, cts: tuple[np.ndarray, ...],
                    eps: float) -> tuple[np.ndarray, ...]:
    """The outputs and the gradients of every input of the plain expression, differentiated by JAX in float64."""
    with jax.enable_x64(True):
        args = tuple(jnp.asarray(a, jnp.float64) for a in (x, scale) + (() if residual is None else (residual,)))
        out, pullback = jax.vjp(lambda *a: reference_rms_norm(*a, eps=eps), *args)
        cotangent = tuple(jnp.asarray(c, jnp.float64) for c in cts)
        grads = pullback(cotangent if residual is not None else cotangent[0])
        outs = (out,) if residual is None else out
        return tuple(np.asarray(a) for a in (*outs, *grads))


def _ours(x: Any, scale: Any, residual: Any, cts: tuple[Any, ...], eps: float, cfg: Any) -> tuple[jax.Array, ...]:
    args = (x, scale) + (() if residual is None else (residual,))

    def run(*a: jax.Array) -> Any:
        extra = {} if residual is None else {"residual": a[2]}
        return ejk.rms_norm(a[0], a[1], eps=eps, platform="triton", cfg=cfg, **extra)

    out, pullback = jax.vjp(run, *args)
    grads = pullback(cts if residual is not None else cts[0])
    return (*((out,) if residual is None else out), *grads)


def _check_against_float64(shape: tuple[int, ...], dtype: Any, cfg: Any, residual: bool, eps: float) -> None:
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape) * np.geomspace(1e-2, 10, shape[-2])[:, None]  # rows of different scales
    scale = 1 + 0.1 * rng.standard_normal(shape[-1])
    r = rng.standard_normal(shape) if residual else None
    cts = tuple(rng.standard_normal(shape) for _ in range(2 if residual else 1))
    # The oracle takes the inputs as rounded to the dtype; our outputs are compared in float64.
    as_dtype = [jnp.asarray(a, dtype) for a in (x, scale, *((r,) if residual else ()), *cts)]
    f64 = [np.asarray(a, np.float64) for a in as_dtype]
    want = _float64_oracle(f64[0], f64[1], f64[2] if residual else None, tuple(f64[-len(cts):]), eps)
    got = _ours(as_dtype[0], as_dtype[1], as_dtype[2] if residual else None, tuple(as_dtype[-len(cts):]), eps, cfg)
    names = ("y", "h", "dx", "dscale", "dresidual") if residual else ("y", "dx", "dscale")
    assert len(got) == len(want) == len(names)
    for name, g, w in zip(names, got, want, strict=True):
        assert g.dtype == dtype and g.shape == w.shape, name
        assert_close(np.asarray(g, np.float64), w, dtype, what=f"rms_norm[triton] {shape} {name}")


@pytest.mark.parametrize(("shape", "dtype", "cfg", "residual"), [
    ((3, 5, 37), jnp.float32, None, False),        # leading dims, an odd width, 15 rows: 4 blocks of 4, 3 programs
    ((1, 100), jnp.float32, TWO_PASS, False),      # one row, two passes over a ragged last chunk
    ((9, 48), jnp.float32, TWO_PASS, False),       # 5 row blocks (the last half empty) over 3 programs, 3 chunks
    ((6, 40), jnp.bfloat16, None, False),
    ((4, 24), jnp.float16, TWO_PASS, False),
    ((2, 7, 37), jnp.float32, None, True),         # residual: h written and normalised, dh added to dx
    ((9, 40), jnp.bfloat16, TWO_PASS, True),       # residual, two passes (h read back from memory)
], ids=["batch-odd-width", "one-row-two-pass", "ragged-row-blocks", "bfloat16", "float16-two-pass", "residual",
        "residual-bfloat16-two-pass"])
def test_values_and_gradients_match_float64(shape: tuple[int, ...], dtype: Any, cfg: Any, residual: bool) -> None:
    _check_against_float64(shape, dtype, cfg, residual, eps=1e-5)


def test_conformance_float32_heuristic() -> None:
    # Its shapes: batched, one row, widths 96 and 1, no rows at all; three of them with a residual.
    assert check_rms_norm("triton", dtypes=(jnp.float32,)) == 9


def test_conformance_bfloat16_two_passes() -> None:
    # The residual form in two passes is checked against float64 below; here one residual case.
    assert check_rms_norm("triton", dtypes=(jnp.bfloat16,), cfg=TWO_PASS, residual_shapes=((5, 96),)) == 7


def test_statistics_are_float32_for_16_bit_inputs() -> None:
    x = jnp.full((3, 20), 300.0, jnp.bfloat16)  # x² = 9e4: fine in float32
    y = ejk.rms_norm(x, jnp.ones(20, jnp.float32), platform="triton")
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), 1.0)
    half = ejk.rms_norm(jnp.full((2, 4), 6e4, jnp.float16), jnp.ones(4, jnp.float16), platform="triton")
    assert half.dtype == jnp.float16
    np.testing.assert_allclose(np.asarray(half, np.float32), 1.0)  # (6e4)² overflows float16, not float32


def test_no_rows_and_one_row() -> None:
    scale = jnp.ones(8, jnp.float32)
    empty = jnp.zeros((2, 0, 8), jnp.float32)
    y, pullback = jax.vjp(lambda x, s: ejk.rms_norm(x, s, platform="triton"), empty, scale)
    dx, ds = pullback(y)
    assert y.shape == dx.shape == (2, 0, 8) and ds.shape == (8,)
    np.testing.assert_array_equal(np.asarray(ds), 0.0)
    x = jnp.asarray([[3.0, -4.0] + [0.0] * 6])  # mean square 25 / 8
    np.testing.assert_allclose(ejk.rms_norm(x, scale, eps=1e-6, platform="triton"),
                               np.asarray(x) / np.sqrt(25 / 8 + 1e-6), rtol=1e-6)


def test_its_backward_runs_on_ejk_xla_forward_residuals_and_back() -> None:
    # Cross-plugin pairing: runs where both plugins are installed with the interpreter (the development venv);
    # nox's triton session installs ejk-triton alone. Each side's own forward+backward is checked above
    # (triton) and by ejk-xla's tests (xla).
    pytest.importorskip("ejk_xla", reason="ejk-xla is not installed: this pairs its forward and backward with ours")
    rng = np.random.default_rng(5)
    x, r, ct, dh = (jnp.asarray(rng.standard_normal((2, 3, 40)), jnp.float32) for _ in range(4))
    scale = jnp.asarray(1 + 0.1 * rng.standard_normal(40), jnp.float32)
    f64 = [np.asarray(a, np.float64) for a in (x, scale, r, ct, dh)]
    want = _float64_oracle(*f64[:2], None, (f64[3],), 1e-6)
    want_residual = _float64_oracle(*f64[:3], (f64[3], f64[4]), 1e-6)
    triton = ejk.ImplChoice(platform="triton", backend=jax.default_backend(), implementation="fused")
    xla = ejk.ImplChoice(platform="xla", backend="any", implementation="fused")
    for choice in (attrs.evolve(xla, backward=triton), attrs.evolve(triton, backward=xla)):
        y, pullback = jax.vjp(lambda x, s, c=choice: ejk.rms_norm(x, s, platform=c.platform, cfg=c), x, scale)
        for got, w in zip((y, *pullback(ct)), want, strict=True):
            np.testing.assert_allclose(np.asarray(got, np.float64), w, rtol=2e-5, atol=2e-5)
        outs, pullback = jax.vjp(lambda x, s, r, c=choice: ejk.rms_norm(x, s, residual=r, platform=c.platform, cfg=c),
                                 x, scale, r)
        for got, w in zip((*outs, *pullback((ct, dh))), want_residual, strict=True):
            np.testing.assert_allclose(np.asarray(got, np.float64), w, rtol=2e-5, atol=2e-5)


def test_vmap_folds_rows_or_maps_a_batched_scale() -> None:
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((3, 5, 24)), jnp.float32)
    scale = jnp.asarray(1 + 0.1 * rng.standard_normal((3, 24)), jnp.float32)
    ours = jax.vmap(lambda x: ejk.rms_norm(x, scale[0], platform="triton"))(x)  # scale not mapped: one launch
    assert_close(ours, reference_rms_norm(x, scale[0]), jnp.float32)
    ours = jax.vmap(lambda x, s: ejk.rms_norm(x, s, platform="triton"))(x, scale)  # mapped scale: one per element
    assert_close(ours, jax.vmap(reference_rms_norm)(x, scale), jnp.float32)
    r = x[::-1]
    both = jax.vmap(lambda x, r: ejk.rms_norm(x, scale[0], residual=r, platform="triton"))(x, r)  # folded too
    for got, want in zip(both, reference_rms_norm(x, scale[0], r), strict=True):
        assert_close(got, want, jnp.float32)
    both = jax.vmap(lambda x: ejk.rms_norm(x, scale[0], residual=r[0], platform="triton"))(x)  # unmapped residual
    for got, want in zip(both, reference_rms_norm(x, scale[0], jnp.broadcast_to(r[0], x.shape)), strict=True):
        assert_close(got, want, jnp.float32)


def test_gate_heuristic_and_config_space() -> None:
    bf16 = jax.ShapeDtypeStruct((16384, 4096), jnp.bfloat16)
    assert capability(bf16, jax.ShapeDtypeStruct((4096,), jnp.float32)) is None
    f64 = jax.ShapeDtypeStruct((4, 8), jnp.float64)
    assert "float64" in str(capability(f64, jax.ShapeDtypeStruct((8,), jnp.float32)))
    # Two rows of 4096 per step (16 KiB) at 16 warps; the backward one 16-warp program per SM.
    assert heuristic_config(bf16, None) == RmsNormConfig(block_rows=2, block_d=0, num_warps=16, bwd_block_d=0,
                                                         bwd_num_warps=16, programs_per_sm=1)
    # 8192 float32 columns: whole rows forward (32 warps), two passes of 2048 backward.
    wide = heuristic_config(jax.ShapeDtypeStruct((1024, 8192), jnp.float32), None)
    assert (wide.block_d, wide.num_warps, wide.bwd_block_d) == (0, 32, 2048)
    narrow = heuristic_config(jax.ShapeDtypeStruct((1024, 96), jnp.bfloat16), None)  # 32 rows of 128: 8 KiB
    assert (narrow.block_rows, narrow.num_warps, narrow.programs_per_sm) == (32, 8, 2)
    with_residual = heuristic_config(bf16, None, bf16)  # the backward also holds dh: one row per step
    assert (with_residual.block_rows, with_residual.num_warps, with_residual.bwd_num_warps) == (1, 8, 16)
    space = config_space(bf16, None)
    assert space[0] == heuristic_config(bf16, None) and len(space) == len(set(space)) == 7
    # The 8 KiB step of one row at 8 warps (two programs per SM) is a neighbour: measured against it.
    assert RmsNormConfig(block_rows=1, num_warps=8, bwd_num_warps=8, programs_per_sm=2) in space
    with pytest.raises(ValueError, match=r"RmsNormConfig.block_d is 24 but needs one of 0, 16, 32"):
        RmsNormConfig(block_d=24)


def test_the_kernels_compile_for_sm90_without_spills(tmp_path: Any) -> None:
    """Compiled for sm_90 (PTX, then a cubin by the ptxas Triton ships) in a process without the interpreter,
    with the heuristic configs: [16k, 4096] bfloat16 (whole rows; the backward holds the most registers), the
    same with a residual, and [64, 32768] float32 (two passes). A spill would cost the bandwidth the kernels
    are for."""
    code = ("from ejk_triton._aot import compile_rms_norm as c; import jax.numpy as jnp; "
            "print(*(' '.join(str(k[f]) for f in ('shared', 'registers', 'spilled')) for a, r in "
            "(((16384, 4096, jnp.bfloat16), False), ((16384, 4096, jnp.bfloat16), True), ((64, 32768, jnp.float32), "
            "False)) for k in c(*a, residual=r).values()), sep='\\n')")
    env = {k: v for k, v in os.environ.items() if k not in ("EJK_TRITON_INTERPRET", "TRITON_INTERPRET")}
    env.update(JAX_PLATFORMS="cpu", TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    kernels = [tuple(int(v) for v in line.split()) for line in done.stdout.splitlines()]
    assert len(kernels) == 6, done.stdout
    for shared, registers, spilled in kernels:
        assert shared <= 64 * 1024 and 0 < registers <= 255 and spilled == 0, kernels


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "d", "dtype", "residual"), [
    (4096, 4096, jnp.bfloat16, False), (2048, 5120, jnp.bfloat16, False), (1000, 2880, jnp.float16, False),
    (512, 32768, jnp.bfloat16, False), (777, 4096, jnp.float32, False), (4096, 4096, jnp.bfloat16, True),
    (300, 20000, jnp.bfloat16, True)])
def test_gpu_values_and_gradients_at_model_widths(rows: int, d: int, dtype: Any, residual: bool) -> None:
    """Llama / Mistral / gpt-oss widths, two-pass widths, float32 and the residual form, against float64."""
    _check_against_float64((rows, d), dtype, None, residual, eps=1e-6)
