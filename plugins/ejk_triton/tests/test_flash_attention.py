"""The Triton flash attention against the materialised reference: values, gradients, masks, gates, configs.

On a CPU the kernels run through Triton's interpreter (``EJK_TRITON_INTERPRET=1``, see conftest.py);
tests marked ``gpu`` run larger shapes compiled on an NVIDIA GPU.
"""

from __future__ import annotations

import functools
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
from ejk.testing import (
    FLASH_ATTENTION_CASES,
    AttentionCase,
    assert_close,
    attention_values_and_grads,
    check_flash_attention,
    fast_jit,
    reference_flash_attention,
)
from ejk_triton import _env
from ejk_triton._flash_attention import (
    FlashAttentionConfig,
    backward,
    capability,
    config_space,
    forward,
    forward_with_residuals,
    heuristic_config,
)

ON_GPU = _env.nvidia_gpu()[0]
needs_kernels = pytest.mark.skipif(not (ON_GPU or _env.interpret_mode()),
                                   reason="needs an NVIDIA GPU or EJK_TRITON_INTERPRET=1")

@attrs.frozen(kw_only=True)
class Case(AttentionCase):
    """An attention problem (see :class:`ejk.testing.AttentionCase`).

    ``blocks`` = (fwd m, fwd n, bwd m, bwd n); ``None`` for the heuristic config.
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
        return FlashAttentionConfig(block_m=m, block_n=n, bwd_block_m=bm, bwd_block_n=bn)


def kernel_fn(case: Case, cfg: FlashAttentionConfig | None = None) -> Any:
    """The registered implementation, with user-level static arguments normalised by the op's checker."""
    cfg = cfg if cfg is not None else case.cfg

    def run(q, k, v, q_segment_ids=None, kv_segment_ids=None, bias=None):  # type: ignore[no-untyped-def]
        return ejk.flash_attention(q, k, v, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=bias,
                                   platform="triton", cfg=cfg, **case.options())

    return run


def reference_fn(case: Case) -> Any:
    return functools.partial(reference_flash_attention, **case.options())


def check_case(case: Case, seed: int = 0) -> tuple[jax.Array, dict[str, Any]]:
    inputs = case.inputs(seed)
    cot = case.cotangent()
    out, grads = attention_values_and_grads(kernel_fn(case), inputs, cot)
    want, want_grads = attention_values_and_grads(reference_fn(case), inputs, cot)
    assert np.isfinite(np.asarray(out, np.float32)).all(), f"{case}: non-finite output"
    assert_close(out, want, case.dtype, what=f"{case} out")
    for name, grad in want_grads.items():
        assert np.isfinite(np.asarray(grads[name], np.float32)).all(), f"{case}: non-finite d{name}"
        assert_close(grads[name], grad, case.dtype, what=f"{case} d{name}")
    return out, grads


CASES = [
    Case(sq=16, sk=16, hq=2, hkv=2, dtype="float16", blocks=None),  # one block, heuristic config
    Case(b=2, sq=40, sk=24, hq=4, hkv=2, causal=True),  # Sq > Sk: leading rows see nothing; GQA 2
    Case(sq=37, sk=53, hq=4, hkv=1, window=(5, 3), dtype="float16"),  # MQA (GQA 4), ragged, two-sided window
    Case(sq=33, sk=33, causal=True, window=7, cap=5.0),  # causal + window + soft cap
    Case(b=2, sq=20, sk=20, hq=4, hkv=2, seg=True, bias="1HQK", dtype="float16"),  # segments, masked rows, bias
    Case(sq=1, sk=33, hq=4, hkv=1, causal=True, blocks=None),  # decode: Sq = 1
    Case(sq=9, sk=1, dtype="float16"),  # Sk = 1
    Case(sq=80, sk=80, hq=2, hkv=1, window=(40, 20), cap=2.0, bias="B11K", dtype="float16"),  # interior blocks
    Case(sq=64, sk=64, hq=4, hkv=2, causal=True),  # causal loop split: diagonal and interior blocks
    Case(sq=24, sk=40, hq=4, hkv=4, d=128, causal=True, blocks=(32, 16, 16, 32)),  # head dim 128
    Case(sq=20, sk=28, hq=2, hkv=1, d=64, dv=32, seg=True, dtype="float16"),  # v head dim != q head dim
    Case(sq=24, sk=40, hq=4, hkv=2, d=48, causal=True, window=(9, 0), cap=3.0, seg=True, bias="11QK",
         dtype="float32"),  # float32 (IEEE dots); head dim 48 is padded to 64 inside the kernels
]


@needs_kernels
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_reference(case: Case) -> None:
    check_case(case)


def _random_cases(n: int, seed: int) -> list[Case]:
    """Mixed masks, lengths, GQA ratios and tile sizes (biases whose gradient is not identically zero)."""
    rng = np.random.default_rng(seed)
    heads = [(1, 1), (2, 1), (4, 2), (4, 1), (2, 2)]
    windows = [None, None, 3, (0, 6), (9, 1), (0, 0), (17, 40), (5, 0)]
    biases = [None, None, "BHQK", "1HQK", "B11K", "B1QK", "11QK"]
    cases = []
    for _ in range(n):
        hq, hkv = heads[rng.integers(len(heads))]
        cases.append(Case(
            b=int(rng.integers(1, 3)), sq=int(rng.choice([1, 5, 16, 29, 48, 70])),
            sk=int(rng.choice([1, 7, 16, 33, 48, 65])), hq=hq, hkv=hkv, d=int(rng.choice([16, 32, 64])),
            causal=bool(rng.integers(2)), window=windows[rng.integers(len(windows))],
            cap=[None, 2.0][rng.integers(2)], seg=bool(rng.integers(2)), bias=biases[rng.integers(len(biases))],
            dtype=str(rng.choice(["float32", "float16", "bfloat16"])),
            blocks=tuple(int(x) for x in rng.choice([16, 32], 4)),  # type: ignore[arg-type]
        ))
    return cases


@needs_kernels
@pytest.mark.parametrize("case", _random_cases(8, seed=2026), ids=str)
def test_random_cases(case: Case) -> None:
    check_case(case, seed=3)


@needs_kernels
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fully_masked_rows_are_zero_with_zero_gradients(dtype: str) -> None:
    # Query i sits at position i + 4 (Sq=8, Sk=12, causal); keys 0-5 are segment 0, keys 6-11 segment 1.
    # Rows 1 and 6 carry an id no key has; row 0 (segment 1, position 4) sees only segment-0 keys.
    case = Case(sq=8, sk=12, hq=2, hkv=1, seg=True, causal=True, dtype=dtype)
    inputs = case.inputs()
    inputs["q_segment_ids"] = jnp.array([[1, 7, 0, 0, 1, 1, 7, 0]], jnp.int32)
    inputs["kv_segment_ids"] = jnp.array([[0] * 6 + [1] * 6], jnp.int32)
    cot = case.cotangent()
    out, grads = attention_values_and_grads(kernel_fn(case), inputs, cot)
    want, want_grads = attention_values_and_grads(reference_fn(case), inputs, cot)
    masked = np.array([1, 1, 0, 0, 0, 0, 1, 0], bool)
    out_np = np.asarray(out, np.float32)
    assert np.all(out_np[:, masked] == 0.0) and np.all(out_np[:, ~masked] != 0.0)
    assert np.all(np.asarray(grads["q"], np.float32)[:, masked] == 0.0)
    assert_close(out, want, dtype)
    for name in ("q", "k", "v"):
        assert_close(grads[name], want_grads[name], dtype, what=f"d{name}")


@needs_kernels
def test_window_that_excludes_everything_and_bias_minus_inf() -> None:
    # Non-causal window (0, 0) with Sq=12 > Sk=4: query i sits at i - 8, so rows 0-7 see nothing.
    case = Case(sq=12, sk=4, hq=2, hkv=1, window=(0, 0), bias="11QK", dtype="float16")
    inputs = case.inputs()
    bias = np.array(inputs["bias"])
    bias[0, 0, 9] = -np.inf  # a whole visible row
    bias[0, 0, 10, :2] = -np.inf  # part of one
    inputs["bias"] = jnp.asarray(bias)
    cot = case.cotangent()
    out, grads = attention_values_and_grads(kernel_fn(case), inputs, cot)
    want, want_grads = attention_values_and_grads(reference_fn(case), inputs, cot)
    out_np = np.asarray(out, np.float32)
    assert np.all(out_np[:, :8] == 0.0) and np.all(out_np[:, 9] == 0.0)
    assert np.all(np.asarray(grads["q"], np.float32)[:, :8] == 0.0)
    assert_close(out, want, "float16")
    for name in ("q", "k", "v", "bias"):
        assert np.isfinite(np.asarray(grads[name], np.float32)).all()
        assert_close(grads[name], want_grads[name], "float16", what=f"d{name}")


@needs_kernels
@pytest.mark.parametrize("pattern", ["1HQ1", "1111"])
def test_bias_constant_along_keys_has_a_zero_gradient(pattern: str) -> None:
    # Softmax ignores a constant added to a row: such a bias's gradient is 0 up to rounding. Exercises
    # the in-kernel sums over keys (and rows and heads, for a scalar) and their atomics.
    case = Case(b=2, sq=20, sk=24, hq=4, hkv=2, causal=True, bias=pattern, dtype="float32")
    inputs = case.inputs()
    cot = case.cotangent()
    out, grads = attention_values_and_grads(kernel_fn(case), inputs, cot)
    want, want_grads = attention_values_and_grads(reference_fn(case), inputs, cot)
    assert_close(out, want, "float32")
    assert grads["bias"].shape == inputs["bias"].shape
    assert float(jnp.max(jnp.abs(grads["bias"]))) < 1e-3
    for name in ("q", "k", "v"):
        assert_close(grads[name], want_grads[name], "float32", what=f"d{name}")


@needs_kernels
def test_public_op_conformance_subset() -> None:
    # The op conformance suite through ejk.flash_attention(platform="triton"): causal GQA, segments,
    # head dim 256 (the test cases above cover the rest without going through the op layer).
    cases = [FLASH_ATTENTION_CASES[i] for i in (1, 7, 9)]
    assert check_flash_attention("triton", dtypes=(jnp.float16,), cases=cases) == 3


@needs_kernels
def test_forward_backward_pieces_match_the_custom_vjp() -> None:
    case = Case(b=1, sq=20, sk=24, hq=4, hkv=2, causal=True, bias="1H1K", dtype="float16")
    inputs = case.inputs()
    cot = case.cotangent()
    static = dict(causal=True, softmax_scale=0.125, sliding_window=None, logits_soft_cap=None)
    kw = dict(q_segment_ids=None, kv_segment_ids=None, bias=inputs["bias"], cfg=case.cfg)

    @fast_jit
    def pieces(q: jax.Array, k: jax.Array, v: jax.Array) -> Any:
        out, residuals = forward_with_residuals(q, k, v, **static, **kw)
        return forward(q, k, v, **static, **kw), out, backward(residuals, cot, cfg=case.cfg, **static)

    plain, out, grads = pieces(inputs["q"], inputs["k"], inputs["v"])
    # one cotangent per array argument: q, k, v, the segment ids, bias and sinks (None without sinks)
    assert len(grads) == 7 and grads[3] is None and grads[4] is None and grads[5].shape == (1, 4, 1, 24)
    assert grads[6] is None
    np.testing.assert_array_equal(np.asarray(plain, np.float32), np.asarray(out, np.float32))
    want, want_grads = attention_values_and_grads(reference_fn(case), inputs, cot)
    assert_close(out, want, "float16")
    for got, name in zip(grads, ("q", "k", "v", "", "", "bias", ""), strict=True):
        if name:
            assert_close(got, want_grads[name], "float16", what=f"d{name}")


@needs_kernels
def test_jit_grad_vmap_compose() -> None:
    # vmap folds the mapped axis into the batch (one launch); unmapped segment ids are shared, the
    # bias is mapped with a broadcast batch dim.
    case = Case(b=2, sq=16, sk=24, hq=2, hkv=1, causal=True, seg=True, bias="1H1K", dtype="float16")
    per = [case.inputs(seed) for seed in range(3)]
    qs, ks, vs, biases = (jnp.stack([p[n] for p in per]) for n in ("q", "k", "v", "bias"))
    seg_q, seg_kv = per[0]["q_segment_ids"], per[0]["kv_segment_ids"]

    def loss(fn: Any, q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array) -> jax.Array:
        mapped = jax.vmap(lambda q, k, v, b: fn(q, k, v, q_segment_ids=seg_q, kv_segment_ids=seg_kv, bias=b))
        return jnp.sum(jnp.sin(mapped(q, k, v, bias).astype(jnp.float32)))

    got = fast_jit(jax.grad(functools.partial(loss, kernel_fn(case)), argnums=(0, 1, 2, 3)))(qs, ks, vs, biases)
    want = fast_jit(jax.grad(functools.partial(loss, reference_fn(case)), argnums=(0, 1, 2, 3)))(qs, ks, vs, biases)
    for g, w, name in zip(got, want, "qkvb", strict=True):
        assert_close(g, w, "float16", what=f"vmap grad d{name}")
    # vmap over q only (k, v shared), outside jit.
    out = jax.vmap(kernel_fn(case), in_axes=(0, None, None))(qs, per[0]["k"], per[0]["v"])
    ref = jax.vmap(reference_fn(case), in_axes=(0, None, None))(qs, per[0]["k"], per[0]["v"])
    assert_close(out, ref, "float16", what="vmap in_axes None")


def test_empty_sequences_give_empty_or_zero_output() -> None:
    q = jnp.ones((1, 3, 2, 16), jnp.bfloat16)
    kv = jnp.ones((1, 0, 1, 16), jnp.bfloat16)
    kw: dict[str, Any] = dict(causal=False, softmax_scale=0.5, sliding_window=None, logits_soft_cap=None,
                              q_segment_ids=None, kv_segment_ids=None, bias=None)
    out = forward(q, kv, kv, cfg=None, **kw)
    assert out.shape == (1, 3, 2, 16) and np.all(np.asarray(out, np.float32) == 0.0)
    assert forward(q[:, :0], q[:, :, :1], q[:, :, :1], cfg=None, **kw).shape == (1, 0, 2, 16)
    grads = backward(forward_with_residuals(q, kv, kv, cfg=None, **kw)[1], out, cfg=None, causal=False,
                     softmax_scale=0.5, sliding_window=None, logits_soft_cap=None)
    assert grads[0].shape == q.shape and not np.any(np.asarray(grads[0], np.float32))


# ----------------------------------------------------------------------------------------------
# Platform selection in the interpreter mode
# ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(ON_GPU, reason="CPU-only behaviour")
def test_auto_never_picks_the_interpreter() -> None:
    ok, reason = ejk.kernel_registry.platform_available("triton")
    assert not ok and reason is not None and reason.startswith("no CUDA GPU")
    try:  # ejk-xla, when installed, is the only available implementation here
        spec = ejk.kernel_registry.get_spec("flash_attention", platform="auto")
    except ejk.KernelNotFoundError as exc:
        assert "Platform 'triton' is unavailable: no CUDA GPU" in str(exc)
    else:
        assert spec.platform != "triton"
    if _env.interpret_mode():
        assert ejk.kernel_registry.get_spec("flash_attention", platform="triton").platform == "triton"


def test_backends_follow_the_interpret_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJK_TRITON_INTERPRET", "1")
    assert _env.backends() == ("gpu", "cpu")
    monkeypatch.setenv("EJK_TRITON_INTERPRET", "0")
    assert _env.backends() == ("gpu",)
    monkeypatch.delenv("EJK_TRITON_INTERPRET")
    assert not _env.interpret_mode()


def test_interpret_mode_after_a_compiled_import_is_an_error() -> None:
    code = ("import os, triton; os.environ['EJK_TRITON_INTERPRET'] = '1'; os.environ.pop('TRITON_INTERPRET', None)\n"
            "from ejk_triton._env import import_triton\n"
            "try:\n    import_triton()\nexcept RuntimeError as e:\n    print('refused:', e)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "EJK_TRITON_INTERPRET")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout and "before the process starts" in result.stdout


_AOT_SCRIPT = """
import json, jax, jax.numpy as jnp
from ejk_triton._aot import compile_flash_attention
from ejk_triton._flash_attention import config_space
sds = jax.ShapeDtypeStruct
q, kv = sds((2, 1000, 16, 128), jnp.bfloat16), sds((2, 1500, 4, 128), jnp.bfloat16)
report = {"plain": compile_flash_attention(q, kv, kv, causal=True)}
report["all features"] = compile_flash_attention(
    sds(q.shape, jnp.float16), sds(kv.shape, jnp.float16), sds(kv.shape, jnp.float16), causal=True,
    sliding_window=(256, 0), logits_soft_cap=30.0, segment_ids=True, bias=sds((1, 16, 1000, 1500), jnp.float32))
q64 = sds((1, 333, 8, 64), jnp.bfloat16)
report["d64 space"] = compile_flash_attention(q64, q64, q64, cfg=config_space(q64, q64, q64)[1])
q256 = sds((1, 200, 4, 256), jnp.bfloat16)
report["d256"] = compile_flash_attention(q256, q256, q256, causal=True)
print(json.dumps(report))
"""


def test_kernels_compile_for_sm90_without_a_gpu(compile_report: Any) -> None:
    # The interpreter runs the kernels' Python; this compiles them as a GPU would (PTX, then a cubin
    # with the ptxas Triton ships), in a process without the interpreter, and checks shared memory.
    report = compile_report(_AOT_SCRIPT)
    for variant, kernels in report.items():
        assert set(kernels) == {"forward", "preprocess", "dkdv", "dq"}, variant
        for name, info in kernels.items():
            assert 0 < info["shared"] <= 227 * 1024, f"{variant} {name}: {info}"


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


def _sds(shape: tuple[int, ...], dtype: Any = jnp.bfloat16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _gate(q: Any = None, k: Any = None, v: Any = None, **kw: Any) -> str | None:
    q = q if q is not None else _sds((2, 128, 8, 128))
    k = k if k is not None else _sds((2, 256, 2, 128), q.dtype)
    v = v if v is not None else _sds((2, 256, 2, 128), q.dtype)
    return capability(q, k, v, **kw)


def test_capability_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJK_TRITON_INTERPRET", "1")
    assert _gate() is None
    assert _gate(causal=True, sliding_window=(64, 0), logits_soft_cap=30.0, bias=_sds((1, 8, 128, 256)),
                 q_segment_ids=_sds((2, 128), jnp.int32), kv_segment_ids=_sds((2, 256), jnp.int32)) is None
    assert _gate(q=_sds((1, 5, 4, 256)), k=_sds((1, 7, 1, 256)), v=_sds((1, 7, 1, 256))) is None
    assert _gate(q=_sds((1, 5, 4, 96)), k=_sds((1, 7, 1, 96)), v=_sds((1, 7, 1, 96))) is None  # padded
    assert _gate(q=_sds((1, 5, 4, 128), jnp.float32)) is None
    assert _gate(q=_sds((1, 5, 4, 512)), k=_sds((1, 7, 1, 512)), v=_sds((1, 7, 1, 512))) == (
        "head_dim 512 not supported (at most 256)")
    assert "head_dim 256 not supported in float32" in (_gate(
        q=_sds((1, 5, 4, 256), jnp.float32), k=_sds((1, 7, 1, 256), jnp.float32),
        v=_sds((1, 7, 1, 256), jnp.float32)) or "")
    assert _gate(q=_sds((1, 5, 4, 128), jnp.float64)) == "float64 not supported (bfloat16, float16 and float32 only)"
    assert "one dtype" in (_gate(v=_sds((2, 256, 2, 128), jnp.float16)) or "")
    assert "grid limit" in (_gate(q=_sds((4096, 8, 32, 64)), k=_sds((4096, 8, 32, 64)), v=_sds((4096, 8, 32, 64)))
                            or "")
    if not ON_GPU:
        ejk.kernel_registry.list_algorithms()  # plugins load (and register for the CPU) while the variable is set
        monkeypatch.delenv("EJK_TRITON_INTERPRET")
        assert (_gate() or "").startswith("needs an NVIDIA GPU (JAX's default backend is cpu)")
        with pytest.raises(ValueError, match=r"platform=triton can run this call.*needs an NVIDIA GPU"):
            ejk.flash_attention(*(jnp.ones((1, 4, 1, 16), jnp.bfloat16),) * 3, platform="triton")


@pytest.mark.parametrize(("field", "bad"), [("block_m", 0), ("block_m", 48), ("block_n", 8), ("block_n", True),
                                            ("num_warps", 3), ("num_stages", 0), ("bwd_block_n", 2.0)])
def test_config_validation(field: str, bad: Any) -> None:
    kwargs: dict[str, Any] = dict(block_m=64, block_n=64)
    kwargs[field] = bad
    with pytest.raises(ValueError, match=f"FlashAttentionConfig.{field}"):
        FlashAttentionConfig(**kwargs)


def test_config_space_and_heuristic_on_gpu_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "interpret_mode", lambda: False)  # the GPU tables, whatever this machine is
    for d, dtype in ((64, jnp.bfloat16), (128, jnp.bfloat16), (256, jnp.float16), (128, jnp.float32)):
        q = _sds((4, 4096, 16, d), dtype)
        space = config_space(q, q, q)
        assert 3 <= len(space) <= 8 and len(set(space)) == len(space)
        heuristic = heuristic_config(q, q, q)
        assert space[0] == heuristic
    big = heuristic_config(*(_sds((4, 4096, 16, 128)),) * 3)
    assert (big.block_m, big.block_n, big.num_warps, big.num_stages) == (128, 64, 8, 3)
    assert (big.bwd_block_m, big.bwd_block_n, big.bwd_num_warps, big.bwd_num_stages) == (32, 64, 4, 3)
    causal = heuristic_config(*(_sds((4, 4096, 16, 128)),) * 3, causal=True)
    assert (causal.bwd_block_m, causal.bwd_block_n, causal.bwd_num_warps, causal.bwd_num_stages) == (64, 128, 8, 1)
    assert set(config_space(*(_sds((4, 4096, 16, 128)),) * 3, causal=True)) == set(config_space(
        *(_sds((4, 4096, 16, 128)),) * 3))  # the same candidates, another order


def test_configs_fit_the_gpu_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from ejk_triton import _flash_attention as fa

    monkeypatch.setattr(_env, "interpret_mode", lambda: False)
    q = _sds((4, 4096, 16, 128))
    bias = _sds((1, 16, 4096, 4096), jnp.float32)
    for limit_kib in (227, 163, 99):
        monkeypatch.setattr(fa, "_smem_limit", lambda limit_kib=limit_kib: limit_kib * 1024)
        for extra in ((), (None, None, bias)):
            space = config_space(q, q, q, *extra)
            assert space and space[0] == heuristic_config(q, q, q, *extra)
            itemsize = 4 if extra else 0
            assert all(fa._smem_bytes(c, 128, 128, 2, itemsize) <= limit_kib * 1024 for c in space), (limit_kib, extra)
    monkeypatch.setattr(fa, "_smem_limit", lambda: 227 * 1024)
    assert len(config_space(q, q, q, None, None, bias)) < len(config_space(q, q, q))  # bias tiles prune some


def test_interpreter_heuristic_uses_small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJK_TRITON_INTERPRET", "1")
    if ON_GPU:
        pytest.skip("on a GPU the GPU tables apply")
    q = _sds((1, 64, 2, 64))
    assert config_space(q, q, q) == [heuristic_config(q, q, q)]
    assert heuristic_config(q, q, q).block_m == 32


# ----------------------------------------------------------------------------------------------
# GPU: larger shapes, compiled
# ----------------------------------------------------------------------------------------------

GPU_CASES = [
    Case(b=2, sq=1024, sk=1024, hq=8, hkv=2, d=128, causal=True, blocks=None),
    Case(b=1, sq=777, sk=1500, hq=8, hkv=8, d=64, window=(256, 64), cap=30.0, dtype="float16", blocks=None),
    Case(b=2, sq=512, sk=512, hq=4, hkv=1, d=256, causal=True, seg=True, blocks=None),
    Case(b=1, sq=300, sk=700, hq=4, hkv=2, d=128, bias="1HQK", dtype="float16", blocks=None),
    Case(b=1, sq=256, sk=384, hq=4, hkv=2, d=128, causal=True, dtype="float32", blocks=None),
    Case(b=1, sq=1, sk=4096, hq=16, hkv=2, d=128, causal=True, blocks=None),
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_gpu_matches_reference(case: Case) -> None:
    check_case(case)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_gpu_config_space_compiles_and_matches() -> None:
    case = Case(b=1, sq=512, sk=512, hq=4, hkv=2, d=128, causal=True, blocks=None)
    inputs = case.inputs()
    want = reference_fn(case)(**inputs)
    for cfg in config_space(inputs["q"], inputs["k"], inputs["v"]):
        assert_close(jax.jit(kernel_fn(case, cfg))(**inputs), want, case.dtype, what=str(cfg))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_gpu_public_op_conformance() -> None:
    assert check_flash_attention("triton", dtypes=(jnp.bfloat16, jnp.float16)) == 2 * len(FLASH_ATTENTION_CASES)
    f32_cases = [c for c in FLASH_ATTENTION_CASES if c["shape"][-1] <= 128]  # the gate: float32 up to D = 128
    assert check_flash_attention("triton", dtypes=(jnp.float32,), cases=f32_cases) == len(f32_cases)
    assert ejk.kernel_registry.platform_available("triton") == (True, None)
    q = jnp.ones((1, 128, 4, 64), jnp.bfloat16)
    assert ejk.flash_attention(q, q, q, causal=True, platform="triton").shape == q.shape
