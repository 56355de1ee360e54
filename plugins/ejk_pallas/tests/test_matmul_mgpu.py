"""The Mosaic GPU matmul (``pallas/gpu:mosaic`` for ``matmul``): values, gradients, gate, configs, lowering.

On a CPU the kernel runs in Pallas's Mosaic GPU interpret mode (``EJK_PALLAS_INTERPRET=1``): the persistent
tile walk over two CTAs, the warp-specialised TMA ring, the two compute warpgroups' halves (split along M and
along N), batches, ragged edges and the chunked epilogue are checked, with the MMAs as plain dots; the
interpreter has no clusters and no transposed MMA operands, so there the backward transposes copies. Every
config of the space, clusters and transposed operands included, is lowered through the real Mosaic GPU
lowering for CUDA. Tests marked ``gpu`` run the compiled kernel on a Hopper GPU.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.plugin import devices
from ejk.testing import assert_close, check_matmul, reference_matmul, values_and_grads
from ejk_pallas import _env
from ejk_pallas import _matmul_mgpu as mm
from ejk_pallas._matmul_mgpu import MosaicMatmulConfig

ON_GPU = _env.nvidia_gpu()[0]
sds = jax.ShapeDtypeStruct
ON_HOPPER = ON_GPU and mm.capability(sds((8, 8), jnp.bfloat16), sds((8, 8), jnp.bfloat16)) is None
needs_kernel = pytest.mark.skipif(
    not (ON_HOPPER or (_env.use_interpreter() and mm._fa.interpret_params() is not None)),
    reason="needs a Hopper GPU, or EJK_PALLAS_INTERPRET=1 and jax's Mosaic GPU interpret mode on a CPU")


def choice(cfg: MosaicMatmulConfig | None = None) -> ejk.ImplChoice:
    return ejk.ImplChoice(platform="pallas", backend="gpu" if ON_GPU else "cpu", implementation="mosaic", cfg=cfg)


def check(sa: tuple[int, ...], sb: tuple[int, ...], dtype: Any, cfg: MosaicMatmulConfig | None = None,
          out_dtype: Any = None, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    a, b = (jnp.asarray(rng.standard_normal(s), dtype) for s in (sa, sb))
    options = {"preferred_element_type": out_dtype}
    got, grads = values_and_grads(lambda a, b: ejk.matmul(a, b, platform="pallas", cfg=choice(cfg), **options),
                                  (a, b), seed=7)
    want, want_grads = values_and_grads(lambda a, b: reference_matmul(a, b, **options), (a, b), seed=7)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert_close(got, want, dtype, what=f"out {sa} x {sb}")
    for g, w, name in zip(grads, want_grads, "ab", strict=True):
        assert g.dtype == jnp.dtype(dtype)
        assert_close(g, w, dtype, what=f"d{name} {sa} x {sb}")


UNCLUSTERED = [
    MosaicMatmulConfig(block_m=128, block_n=128, split="m", cluster="none", stages=2, band=2),
    MosaicMatmulConfig(block_m=64, block_n=128, split="n", cluster="none", stages=3, order="m"),
]


# ----------------------------------------------------------------------------------------------
# Interpret mode (CPU) or the GPU: small shapes
# ----------------------------------------------------------------------------------------------


@needs_kernel
def test_conformance() -> None:
    """The conformance suite's shapes (1-D operands, broadcast batches, 1x1), values and gradients."""
    assert check_matmul("pallas", dtypes=(jnp.bfloat16,), cfg=choice(UNCLUSTERED[1])) == 8


CASES = [
    # Ragged edges: three row tiles over two CTAs (one CTA walks two), k of three steps over a 2-slot ring,
    # n below one block; float32 out.
    ((300, 150), (150, 100), jnp.bfloat16, jnp.float32, UNCLUSTERED[0]),
    # A batch of products (b batched too), float16, split along N, the snake along M.
    ((3, 70, 64), (3, 64, 130), jnp.float16, None, UNCLUSTERED[1]),
    # One row; the heuristic's config.
    ((1, 64), (64, 64), jnp.bfloat16, None, None),
]


@needs_kernel
@pytest.mark.parametrize("sa,sb,dtype,out_dtype,cfg", CASES, ids=lambda x: str(x) if isinstance(x, tuple) else None)
def test_matches_reference(sa: tuple[int, ...], sb: tuple[int, ...], dtype: Any, out_dtype: Any,
                           cfg: MosaicMatmulConfig | None) -> None:
    check(sa, sb, dtype, cfg=cfg, out_dtype=out_dtype)


@needs_kernel
@pytest.mark.parametrize("ta,tb", [(True, False), (False, True)], ids=["a_t", "b_t"])
def test_transposed_products(ta: bool, tb: bool) -> None:
    """``aᵀ · b`` and ``a · bᵀ`` (the backward's products) read as stored, ragged sizes, a batch of two."""
    rng = np.random.default_rng(3)
    z, m, k, n = 2, 100, 130, 72
    x = jnp.asarray(rng.standard_normal((z, k, m) if ta else (z, m, k)), jnp.bfloat16)
    y = jnp.asarray(rng.standard_normal((z, n, k) if tb else (z, k, n)), jnp.bfloat16)
    got = mm.product(x, y, ta=ta, tb=tb, out_dtype=jnp.float32, cfg=UNCLUSTERED[0])
    want = jnp.matmul(jnp.swapaxes(x, 1, 2) if ta else x, jnp.swapaxes(y, 1, 2) if tb else y,
                      preferred_element_type=jnp.float32)
    assert_close(got, want, jnp.bfloat16, what=f"ta={ta} tb={tb}")


@needs_kernel
@pytest.mark.skipif(ON_GPU, reason="the interpreter has no clusters; on a GPU they run")
def test_interpret_mode_refuses_clusters() -> None:
    x = jnp.ones((1, 64, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="cluster='none'"):
        mm.product(x, x, out_dtype=jnp.bfloat16, cfg=MosaicMatmulConfig())


# ----------------------------------------------------------------------------------------------
# Gate and configs
# ----------------------------------------------------------------------------------------------


def test_gate() -> None:
    a = sds((256, 512), jnp.bfloat16)
    assert "float32" in (mm.capability(sds((8, 8), jnp.float32), sds((8, 8), jnp.float32)) or "")
    assert "float16" in (mm.capability(a, sds((512, 8), jnp.float16)) or "")
    assert "preferred_element_type int32" in (mm.capability(a, sds((512, 8), jnp.bfloat16),
                                                            preferred_element_type=jnp.int32) or "")
    assert "2**31" in (mm.capability(sds((2**16, 2**15), jnp.bfloat16), sds((2**15, 8), jnp.bfloat16)) or "")
    why = mm.capability(a, sds((512, 8), jnp.bfloat16))
    if not (ON_HOPPER or _env.use_interpreter()):
        assert why is not None and "sm_90" in why


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="128x128"):
        MosaicMatmulConfig(block_m=256, block_n=256, split="m")  # 128x256 a warpgroup: too many registers
    with pytest.raises(ValueError, match="64 or 128 rows"):
        MosaicMatmulConfig(block_m=64, block_n=128, split="m")  # 32-row halves
    with pytest.raises(ValueError, match="split"):
        MosaicMatmulConfig(split="k")
    assert MosaicMatmulConfig(block_m=256, block_n=128, split="m").warpgroup_tile == (128, 128)


def test_configs_fit_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "use_interpreter", lambda: False)  # the GPU's space
    monkeypatch.setattr(devices, "sm_count", lambda: 132)
    a = sds((8192, 8192), jnp.bfloat16)
    for out in (None, jnp.float32):
        space = mm.config_space(a, a, preferred_element_type=out)
        assert space[0] == mm.heuristic_config(a, a, preferred_element_type=out)
        assert len(set(space)) == len(space) and {c.order for c in space} == {"m", "n"}
        size = jnp.dtype(jnp.bfloat16 if out is None else out).itemsize
        assert all(mm.smem_bytes(c, 2, size) <= mm._SMEM_BUDGET for c in space)
    assert mm.heuristic_config(a, a) == MosaicMatmulConfig(block_m=128, block_n=256, split="n", cluster="m", stages=4)
    # Few rows: no tile taller than twice them; a small product takes the config with the most tiles.
    assert mm.heuristic_config(sds((16, 4096), jnp.bfloat16), sds((4096, 4096), jnp.bfloat16)).block_m == 64


def test_interpret_space_has_no_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "use_interpreter", lambda: True)
    a = sds((512, 512), jnp.bfloat16)
    space = mm.config_space(a, a)
    assert space and all(c.cluster == "none" for c in space)


def test_registered() -> None:
    spec = ejk.kernel_registry.get_spec("matmul", platform="pallas", backend="gpu", name="mosaic")
    assert spec.cfg_type is MosaicMatmulConfig
    assert spec.vjp is not None and spec.vjp.residuals == "matmul:inputs"


# ----------------------------------------------------------------------------------------------
# Lowering for CUDA on the CPU: every config, transposed operands, dtypes and output dtypes
# ----------------------------------------------------------------------------------------------


def _lower(cfg: MosaicMatmulConfig, ta: bool = False, tb: bool = False, dtype: Any = jnp.bfloat16,
           out: Any = None, z: int = 1, m: int = 1000, k: int = 300, n: int = 520) -> None:
    x = sds((z, k, m) if ta else (z, m, k), dtype)
    y = sds((z, n, k) if tb else (z, k, n), dtype)

    def f(x: Any, y: Any) -> Any:
        return mm.product(x, y, ta=ta, tb=tb, out_dtype=out or dtype, cfg=cfg)

    text = jax.jit(f).trace(x, y).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text, "no Mosaic GPU custom call in the lowered module"


def _gpu_space() -> list[MosaicMatmulConfig]:
    return mm._fitting(2, 2, clusters=True)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True)], ids=["ab", "a_t", "b_t"])
@pytest.mark.parametrize("cfg", _gpu_space(), ids=lambda c: f"{c.block_m}x{c.block_n}{c.split}c{c.cluster}s{c.stages}")
def test_every_config_lowers_for_cuda(cfg: MosaicMatmulConfig, ta: bool, tb: bool,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "use_interpreter", lambda: False)
    _lower(cfg, ta, tb)


def test_float16_and_float32_out_lower_for_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "use_interpreter", lambda: False)
    _lower(MosaicMatmulConfig(stages=3), dtype=jnp.float16, out=jnp.float32, z=3)
    _lower(MosaicMatmulConfig(block_m=64, block_n=128, cluster="none"), dtype=jnp.float16, m=5, k=20, n=3)


# ----------------------------------------------------------------------------------------------
# GPU (marker `gpu`): the compiled kernel at real sizes
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper GPU")
def test_gpu_every_config() -> None:
    """Every config of the space with both snake orders, values and gradients, ragged sizes."""
    a = sds((1000, 700), jnp.bfloat16)
    for cfg in mm.config_space(a, sds((700, 1100), jnp.bfloat16)):
        check((1000, 700), (700, 1100), jnp.bfloat16, cfg=cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("sa,sb,dtype,out", [
    ((4096, 4096), (4096, 4096), jnp.bfloat16, None),
    ((2, 3, 333, 200), (3, 200, 77), jnp.float16, jnp.float32),
    ((8, 1000), (1000, 3000), jnp.bfloat16, None),
])
def test_gpu_sizes(sa: tuple[int, ...], sb: tuple[int, ...], dtype: Any, out: Any) -> None:
    check(sa, sb, dtype, out_dtype=out)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper GPU")
def test_gpu_conformance() -> None:
    check_matmul("pallas", dtypes=(jnp.bfloat16, jnp.float16), cfg=choice())
