"""The Pallas (Triton-lowered) flash attention against the materialised reference, its gate and configs.

On a CPU the kernels run in Pallas's interpret mode (``EJK_PALLAS_INTERPRET=1``, see conftest.py);
tests marked ``gpu`` run larger shapes compiled on an NVIDIA GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import (
    FLASH_ATTENTION_CASES,
    AttentionCase,
    assert_close,
    attention_values_and_grads,
    check_flash_attention,
    reference_flash_attention,
)
from ejk_pallas import _env
from ejk_pallas._flash_attention import (
    FlashAttentionConfig,
    _backward_impl,
    _forward_impl,
    capability,
    config_space,
    heuristic_config,
)
from ejk_pallas._flash_attention_tpu import TpuFlashAttentionConfig
from ejk_pallas._flash_attention_tpu import capability as tpu_capability

ON_GPU = _env.nvidia_gpu()[0]
needs_kernels = pytest.mark.skipif(not (ON_GPU or _env.interpret_mode()),
                                   reason="needs an NVIDIA GPU or EJK_PALLAS_INTERPRET=1")

@attrs.frozen(kw_only=True)
class Case(AttentionCase):
    """An attention problem (see :class:`ejk.testing.AttentionCase`).

    ``blocks`` = (fwd q, fwd k, bwd q step, bwd k program); ``None`` for the heuristic config.
    """

    d: int = 64
    dtype: str = "bfloat16"
    blocks: tuple[int, int, int, int] | None = (16, 16, 16, 16)

    def label_parts(self) -> list[str]:
        return [*super().label_parts(), f"blk{'x'.join(map(str, self.blocks))}" if self.blocks else "heuristic"]

    @property
    def cfg(self) -> FlashAttentionConfig | None:
        if self.blocks is None:
            return None
        m, n, bm, bn = self.blocks
        return FlashAttentionConfig(block_q=m, block_k=n, bwd_block_q=bm, bwd_block_k=bn)


def check_case(case: Case, seed: int = 0, cfg: Any = None) -> tuple[jax.Array, dict[str, Any]]:
    inputs = case.inputs(seed)
    cot = case.cotangent()
    ours = functools.partial(ejk.flash_attention, platform="pallas", cfg=case.cfg if cfg is None else cfg,
                             **case.options())
    out, grads = attention_values_and_grads(ours, inputs, cot)
    want, want_grads = attention_values_and_grads(functools.partial(reference_flash_attention, **case.options()),
                                        inputs, cot)
    assert out.dtype == inputs["q"].dtype
    assert np.isfinite(np.asarray(out, np.float32)).all(), f"{case}: non-finite output"
    assert_close(out, want, case.dtype, what=f"{case} out")
    for name, grad in want_grads.items():
        assert np.isfinite(np.asarray(grads[name], np.float32)).all(), f"{case}: non-finite d{name}"
        assert_close(grads[name], grad, case.dtype, what=f"{case} d{name}")
    return out, grads


CASES = [
    Case(sq=16, sk=16, hq=2, hkv=2, dtype="float16", blocks=None),  # one block, heuristic config
    Case(b=2, sq=40, sk=24, hq=4, hkv=2, causal=True),  # Sq > Sk: leading rows see nothing; GQA 2; ragged
    Case(sq=37, sk=53, hq=4, hkv=1, window=(5, 3), dtype="float16"),  # MQA (GQA 4), ragged, two-sided window
    Case(sq=33, sk=33, causal=True, window=7, cap=5.0),  # causal + window + soft cap
    Case(b=2, sq=20, sk=20, hq=4, hkv=2, seg=True, dtype="float16"),  # segments with fully masked rows
    Case(sq=1, sk=33, hq=4, hkv=1, causal=True, blocks=None),  # decode: Sq = 1
    Case(sq=9, sk=1, dtype="float16"),  # Sk = 1
    Case(sq=80, sk=80, hq=2, hkv=1, window=(40, 20), cap=2.0, dtype="float16"),  # interior + edge blocks
    Case(sq=64, sk=64, hq=4, hkv=2, causal=True),  # causal loop split: diagonal and interior blocks
    Case(sq=48, sk=80, hq=6, hkv=2, causal=True, cap=10.0),  # GQA 3 (group not a power of two), Sq < Sk
    Case(sq=24, sk=40, hq=4, hkv=4, d=128, causal=True, blocks=(32, 16, 16, 32)),  # head dim 128
    Case(sq=20, sk=28, hq=2, hkv=1, d=256, dv=64, window=(6, 2), dtype="float16"),  # head dim 256, Dv != D
    Case(sq=24, sk=40, hq=4, hkv=2, d=48, causal=True, window=(9, 0), cap=3.0, seg=True),  # D 48 padded to 64
    Case(b=2, sq=20, sk=28, hq=4, hkv=2, causal=True, bias="BHQK"),  # full bias, GQA 2
    Case(b=2, sq=33, sk=17, hq=6, hkv=2, window=(5, 3), cap=3.0, seg=True, bias="1H1K",
         dtype="float16"),  # broadcast bias (batch, rows) with window, cap and segments; GQA 3
    Case(sq=20, sk=28, hq=4, hkv=1, bias="11QK"),  # bias shared by every head (summed over 4 q heads)
]


@needs_kernels
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_reference(case: Case) -> None:
    check_case(case)


@needs_kernels
def test_rows_that_see_nothing_are_zero_with_zero_gradients() -> None:
    case = Case(sq=24, sk=8, hq=2, hkv=1, causal=True, blocks=(16, 16, 16, 16))  # rows 0..15 see no key
    out, grads = check_case(case)
    assert not np.asarray(out[:, :16], np.float32).any()
    assert not np.asarray(grads["q"][:, :16], np.float32).any()


@needs_kernels
def test_bias_minus_inf_rows_are_zero_with_zero_gradients() -> None:
    """A row whose every key carries a -inf bias sees nothing: zeros, zero gradients, no NaN."""
    case = Case(sq=16, sk=32, hq=2, hkv=1, bias="11QK")
    inputs = case.inputs()
    inputs["bias"] = inputs["bias"].at[:, :, 3].set(-jnp.inf)
    cot = jnp.ones((1, 16, 2, 64), jnp.bfloat16)
    ours = functools.partial(ejk.flash_attention, platform="pallas", cfg=case.cfg)
    out, grads = attention_values_and_grads(ours, inputs, cot)
    want, _ = attention_values_and_grads(reference_flash_attention, inputs, cot)
    assert_close(out, want, jnp.bfloat16)
    assert not np.asarray(out[:, 3], np.float32).any()
    assert not np.asarray(grads["q"][:, 3], np.float32).any()
    assert np.isfinite(np.asarray(grads["bias"])[:, :, :3]).all()


@needs_kernels
def test_conformance_subset() -> None:
    cases = [c for c in FLASH_ATTENTION_CASES if not c.get("bias")][1::3]  # causal GQA; window + cap; Sq > Sk
    cases += [c for c in FLASH_ATTENTION_CASES if c.get("bias")]
    assert check_flash_attention("pallas", dtypes=(jnp.bfloat16,), cases=cases) == len(cases)


@needs_kernels
def test_vmap_and_jit() -> None:
    case = Case(sq=16, sk=32, hq=2, hkv=1, causal=True)
    inputs = case.inputs()
    q, k, v = (jnp.stack([inputs[n], inputs[n] * 0.5]) for n in ("q", "k", "v"))
    got = jax.jit(jax.vmap(lambda q, k, v: ejk.flash_attention(q, k, v, causal=True, platform="pallas")))(q, k, v)
    want = jax.vmap(lambda q, k, v: reference_flash_attention(q, k, v, causal=True))(q, k, v)
    assert_close(got, want, jnp.bfloat16)


def _abstract(b: int, sq: int, sk: int, hq: int, hkv: int, d: int, dtype: Any = jnp.bfloat16,
              dv: int | None = None) -> tuple[jax.ShapeDtypeStruct, ...]:
    return (jax.ShapeDtypeStruct((b, sq, hq, d), dtype), jax.ShapeDtypeStruct((b, sk, hkv, d), dtype),
            jax.ShapeDtypeStruct((b, sk, hkv, dv or d), dtype))


def test_gate_refuses_what_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = _abstract(1, 16, 16, 2, 2, 64)
    f32 = _abstract(1, 16, 16, 2, 2, 64, jnp.float32)
    assert "float32 not supported" in (capability(*f32) or "")
    assert "share one dtype" in (capability(q, k, _abstract(1, 16, 16, 2, 2, 64, jnp.float16)[2]) or "")
    assert "head_dim 512" in (capability(*_abstract(1, 16, 16, 2, 2, 512)) or "")
    assert "bias of dtype int32" in (capability(q, k, v, bias=jax.ShapeDtypeStruct((1, 2, 16, 16), jnp.int32)) or "")
    monkeypatch.setenv(_env.INTERPRET_ENV, "1")
    assert capability(q, k, v, causal=True, logits_soft_cap=3.0, sliding_window=(4, 0)) is None or ON_GPU
    if not ON_GPU:
        monkeypatch.delenv(_env.INTERPRET_ENV)
        assert "needs an NVIDIA GPU" in (capability(q, k, v) or "")


def test_gate_turns_the_op_away_with_its_reason() -> None:
    q, k, v = (jnp.zeros((1, 8, 2, 16), jnp.float32),) * 3  # triton_lowered: no float32; mosaic_tpu: no bias
    with pytest.raises(ValueError, match="float32 not supported") as err:
        ejk.flash_attention(q, k, v, bias=jnp.zeros((1, 2, 8, 8)), platform="pallas")
    assert "bias not supported" in str(err.value) or not _env.use_interpreter()


def test_configs() -> None:
    for d in (64, 128, 256, 80):
        q, k, v = _abstract(2, 512, 512, 8, 2, d)
        space = config_space(q, k, v)
        assert space and all(isinstance(c, FlashAttentionConfig) for c in space)
        assert heuristic_config(q, k, v) == space[0]
    with pytest.raises(ValueError, match="power of two"):
        FlashAttentionConfig(block_q=48, block_k=64)
    with pytest.raises(ValueError, match="num_warps"):
        FlashAttentionConfig(block_q=64, block_k=64, num_warps=3)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_lowers_for_cuda(d: int) -> None:
    """Forward and backward lower through Pallas's Triton lowering for the CUDA platform (no GPU needed)."""
    cfg = heuristic_config(*_abstract(2, 300, 300, 6, 2, d)) if ON_GPU else FlashAttentionConfig(
        **{**dict(block_q=128, block_k=64, num_warps=8, num_stages=3, bwd_block_q=32, bwd_block_k=128,
                  bwd_num_warps=8), **({"block_q": 64, "bwd_block_q": 16, "bwd_block_k": 64} if d == 256 else {})})
    static = dict(cfg=cfg, causal=True, softmax_scale=0.1, sliding_window=(64, 0), logits_soft_cap=30.0,
                  interpret=False)

    def f(q: Any, k: Any, v: Any, qs: Any, ks: Any, bias: Any, do: Any) -> Any:
        out, lse = _forward_impl(q, k, v, qs, ks, bias, **static)  # type: ignore[arg-type]
        return _backward_impl(q, k, v, qs, ks, bias, out, lse, do, **static)  # type: ignore[arg-type]

    q, k, v = _abstract(2, 300, 300, 6, 2, d)
    seg = jax.ShapeDtypeStruct((2, 300), jnp.int32)
    bias = jax.ShapeDtypeStruct((1, 6, 1, 300), jnp.bfloat16)
    text = jax.jit(f).trace(q, k, v, seg, seg, bias, q).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 4  # forward, dk/dv, dq, dbias


# ----------------------------------------------------------------------------------------------
# Mosaic TPU (untested on TPU hardware): the TPU interpret mode on the CPU
# ----------------------------------------------------------------------------------------------

needs_tpu_kernels = pytest.mark.skipif(not (jax.default_backend() == "tpu" or _env.use_interpreter()),
                                       reason="needs a TPU or EJK_PALLAS_INTERPRET=1 on a CPU")


def tpu_choice(block_q: int = 8, block_k: int = 16, bwd_block_q: int = 16, bwd_block_k: int = 8) -> ejk.ImplChoice:
    backend = "tpu" if jax.default_backend() == "tpu" else "cpu"
    return ejk.ImplChoice(platform="pallas", backend=backend, implementation="mosaic_tpu",
                          cfg=TpuFlashAttentionConfig(block_q=block_q, block_k=block_k, bwd_block_q=bwd_block_q,
                                                      bwd_block_k=bwd_block_k))


TPU_CASES = [
    Case(b=2, sq=40, sk=24, hq=4, hkv=2, causal=True),  # Sq > Sk: leading rows see nothing; GQA 2
    Case(sq=37, sk=53, hq=6, hkv=2, window=(5, 3), cap=4.0, dtype="float16"),  # GQA 3, ragged, window, cap
    Case(b=2, sq=20, sk=20, hq=4, hkv=1, seg=True, dtype="float32"),  # segments, masked rows, MQA, float32
    Case(sq=1, sk=33, hq=4, hkv=1, d=128, causal=True),  # decode: Sq = 1
]


@needs_tpu_kernels
@pytest.mark.parametrize("case", TPU_CASES, ids=str)
def test_mosaic_tpu_matches_reference(case: Case) -> None:
    check_case(case, cfg=tpu_choice())


@needs_tpu_kernels
def test_mosaic_tpu_under_vmap_over_a_leading_batch_axis() -> None:
    """A vmapped axis is folded into the kernels' batch (a batched grid broke the TPU interpreter)."""
    case = Case(b=2, sq=16, sk=24, hq=4, hkv=2, causal=True, seg=True, dtype="float32")
    inputs = case.inputs()
    names = ("q", "k", "v", "q_segment_ids", "kv_segment_ids")
    stacked = {n: jnp.stack([inputs[n], inputs[n][::-1]]) for n in names}
    k_shared = inputs["k"]  # one k for every mapped slice: an unbatched argument

    def ours(q: Any, v: Any, qs: Any, ks: Any) -> Any:
        return ejk.flash_attention(q, k_shared, v, causal=True, q_segment_ids=qs, kv_segment_ids=ks,
                                   platform="pallas", cfg=tpu_choice())

    def want(q: Any, v: Any, qs: Any, ks: Any) -> Any:
        return reference_flash_attention(q, k_shared, v, causal=True, q_segment_ids=qs, kv_segment_ids=ks)

    args = tuple(stacked[n] for n in ("q", "v", "q_segment_ids", "kv_segment_ids"))
    assert_close(jax.jit(jax.vmap(ours))(*args), jax.vmap(want)(*args), jnp.float32)
    loss = lambda f: lambda q, v, qs, ks: jax.vmap(f)(q, v, qs, ks).sum()  # noqa: E731
    got = jax.grad(loss(ours), argnums=(0, 1))(*args)
    expected = jax.grad(loss(want), argnums=(0, 1))(*args)
    for g, w, what in zip(got, expected, ("dq", "dv"), strict=True):
        assert_close(g, w, jnp.float32, what=what)


@needs_tpu_kernels
def test_mosaic_tpu_conformance_subset() -> None:
    cases = [c for c in FLASH_ATTENTION_CASES if not c.get("bias")][2::4]  # Sq = 1 MQA; segments
    check_flash_attention("pallas", dtypes=(jnp.float32,), cases=cases, cfg=tpu_choice(16, 16, 16, 16))


def test_mosaic_tpu_gate() -> None:
    q, k, v = _abstract(1, 16, 16, 2, 2, 64, jnp.float32)
    assert "bias not supported" in (tpu_capability(q, k, v, bias=jax.ShapeDtypeStruct((1, 1, 16, 16),
                                                                                      jnp.float32)) or "")
    if not _env.use_interpreter() and jax.default_backend() != "tpu":
        assert "needs a TPU" in (tpu_capability(q, k, v) or "")
    with pytest.raises(ValueError, match="multiple of 8"):
        TpuFlashAttentionConfig(block_q=12, block_k=16)


@pytest.mark.parametrize("d", [64, 128])
def test_mosaic_tpu_lowers_for_tpu(d: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward and backward lower through Pallas's Mosaic TPU lowering on the CPU (a TPU v5p is faked
    through jax's private ``tpu_info``; Mosaic's own compiler passes run only on a TPU host)."""
    from ejk_pallas import _flash_attention_tpu as tpu

    try:
        from jax._src.pallas.mosaic import tpu_info
    except ImportError:  # pragma: no cover - private module moved
        pytest.skip("jax._src.pallas.mosaic.tpu_info not found")
    if jax.default_backend() != "tpu":
        monkeypatch.setattr(tpu_info, "get_device_kind", lambda: "TPU v5p")
        monkeypatch.setattr(tpu_info, "get_num_device_cores", lambda: 1)
    cfg = TpuFlashAttentionConfig(block_q=128, block_k=128)
    static = dict(cfg=cfg, causal=True, softmax_scale=0.1, sliding_window=(256, 0), logits_soft_cap=30.0,
                  interpret=False)

    def f(q: Any, k: Any, v: Any, qs: Any, ks: Any, do: Any) -> Any:
        out, lse = tpu._forward_impl(q, k, v, qs, ks, **static)  # type: ignore[arg-type]
        return tpu._backward_impl(q, k, v, qs, ks, out, lse, do, **static)  # type: ignore[arg-type]

    q, k, v = _abstract(2, 512, 512, 4, 2, d)
    seg = jax.ShapeDtypeStruct((2, 512), jnp.int32)
    text = jax.jit(f).trace(q, k, v, seg, seg, q).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("tpu_custom_call") == 3  # forward, dk/dv, dq


# ----------------------------------------------------------------------------------------------
# GPU (marker `gpu`): compiled kernels at real sizes
# ----------------------------------------------------------------------------------------------

GPU_CASES = [
    Case(b=2, sq=1024, sk=1024, hq=8, hkv=2, d=128, causal=True, blocks=None),
    Case(b=1, sq=1000, sk=1500, hq=8, hkv=8, d=64, window=(128, 64), cap=30.0, blocks=None, dtype="float16"),
    Case(b=2, sq=512, sk=512, hq=4, hkv=1, d=256, causal=True, seg=True, blocks=None),
    Case(b=2, sq=700, sk=900, hq=8, hkv=2, d=128, causal=True, bias="1HQK", blocks=None),
    Case(b=1, sq=1, sk=4096, hq=16, hkv=4, d=128, causal=True, blocks=None),
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_gpu_matches_reference(case: Case) -> None:
    check_case(case)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_gpu_conformance() -> None:
    check_flash_attention("pallas", dtypes=(jnp.bfloat16, jnp.float16))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_gpu_every_config_runs() -> None:
    case = Case(b=1, sq=384, sk=384, hq=4, hkv=2, d=128, causal=True)
    q, k, v = _abstract(1, 384, 384, 4, 2, 128)
    for cfg in config_space(q, k, v):
        check_case(attrs.evolve(case, blocks=(cfg.block_q, cfg.block_k, cfg.bwd_block_q, cfg.bwd_block_k)))


# ----------------------------------------------------------------------------------------------
# Platform selection in interpret mode
# ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(ON_GPU or jax.default_backend() == "tpu", reason="CPU-only behaviour")
def test_auto_never_picks_interpret_mode() -> None:
    ok, reason = ejk.kernel_registry.platform_available("pallas")
    assert not ok and reason is not None and reason.startswith("no NVIDIA GPU or TPU")
    try:  # ejk-xla, when installed, is the only available implementation here
        spec = ejk.kernel_registry.get_spec("flash_attention", platform="auto")
    except ejk.KernelNotFoundError as exc:
        assert "Platform 'pallas' is unavailable" in str(exc)
    else:
        assert spec.platform != "pallas"
    if _env.interpret_mode():
        spec = ejk.kernel_registry.get_spec("flash_attention", platform="pallas")
        # The Mosaic GPU kernel ranks first (Hopper only: its gate passes other devices to triton_lowered).
        assert (spec.platform, spec.name) == ("pallas", "mosaic")
