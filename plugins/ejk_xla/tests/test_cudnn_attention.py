"""cuDNN attention: the capability gate and argument mapping (CPU), numerics on a GPU (marker ``gpu``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest

import ejk
from ejk.testing import assert_close, reference_flash_attention, values_and_grads
from ejk_xla import _cudnn_attention
from ejk_xla._cudnn_attention import cudnn_arguments, shape_problem

BF16 = jnp.bfloat16


def _sds(shape: tuple[int, ...], dtype: Any = BF16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _call(b: int = 2, sq: int = 128, hq: int = 8, sk: int = 128, hkv: int = 2, d: int = 128, dv: int | None = None,
          dtype: Any = BF16, **options: Any) -> dict[str, Any]:
    call: dict[str, Any] = {
        "q": _sds((b, sq, hq, d), dtype), "k": _sds((b, sk, hkv, d), dtype),
        "v": _sds((b, sk, hkv, d if dv is None else dv), dtype),
        "causal": False, "softmax_scale": 0.1, "sliding_window": None, "logits_soft_cap": None,
        "q_segment_ids": None, "kv_segment_ids": None, "bias": None,
    }
    call.update(options)
    return call


ACCEPTED = [
    pytest.param(_call(), id="mha-gqa-full"),
    pytest.param(_call(dtype=jnp.float16, d=64), id="fp16-d64"),
    pytest.param(_call(d=256, causal=True), id="d256-causal"),
    pytest.param(_call(d=96, sq=1000, sk=1000), id="d96"),
    pytest.param(_call(d=120, sq=2, sk=4096), id="d120-sq2"),
    pytest.param(_call(causal=True, sliding_window=(64, 0)), id="causal-window"),
    pytest.param(_call(sliding_window=(64, 0)), id="left-window"),
    pytest.param(_call(sq=64, sk=4096), id="sq-ne-sk-full"),
    pytest.param(_call(bias=_sds((1, 8, 128, 128))), id="bias-1h"),
    pytest.param(_call(bias=_sds((2, 1, 128, 128))), id="bias-b1"),
    pytest.param(_call(sq=2, sk=2), id="sq-2"),
    pytest.param(_call(d=192, dv=128, causal=True), id="mla-192-128"),
    pytest.param(_call(d=64, dv=128), id="dv-wider"),
    pytest.param(_call(causal=True, q_segment_ids=_sds((2, 128), jnp.int32),
                       kv_segment_ids=_sds((2, 128), jnp.int32)), id="segments-causal"),
]

REFUSED = [
    pytest.param(_call(dtype=jnp.float32), "float32 not supported", id="float32"),
    pytest.param(_call(d=100), "head_dim 100", id="d-not-multiple-of-8"),
    pytest.param(_call(d=512), "head_dim 512", id="d-too-large"),
    pytest.param(_call(d=192, dv=100), "v head dim 100", id="dv-not-multiple-of-8"),
    pytest.param(_call(d=128, dv=512), "v head dim 512", id="dv-too-large"),
    pytest.param(_call(logits_soft_cap=30.0), "soft cap not supported", id="soft-cap"),
    pytest.param(_call(q_segment_ids=_sds((2, 128), jnp.int32), kv_segment_ids=_sds((2, 128), jnp.int32),
                       bias=_sds((1, 8, 128, 128))), "segment ids with a bias", id="segments-bias"),
    pytest.param(_call(sq=64, q_segment_ids=_sds((2, 64), jnp.int32), kv_segment_ids=_sds((2, 128), jnp.int32)),
                 "Sq=64 != Sk=128", id="segments-sq-ne-sk"),
    pytest.param(_call(b=64, sq=8192, sk=8192, hq=32, q_segment_ids=_sds((64, 8192), jnp.int32),
                       kv_segment_ids=_sds((64, 8192), jnp.int32)), "softmax statistics", id="segments-stats"),
    pytest.param(_call(sq=64, sk=128, causal=True), "top-left aligned", id="causal-sq-ne-sk"),
    pytest.param(_call(sq=64, sk=128, sliding_window=(8, 0)), "top-left aligned", id="window-sq-ne-sk"),
    pytest.param(_call(sliding_window=(8, 8)), "right reach", id="right-window"),
    pytest.param(_call(bias=_sds((1, 1, 1, 128))), "broadcasts over a sequence axis", id="bias-broadcast-q"),
    pytest.param(_call(sq=255, sk=255), "odd length", id="odd-lengths"),
    pytest.param(_call(sq=7, sk=512), "odd length", id="odd-q"),
    pytest.param(_call(sq=1, sk=4096), "odd length", id="decode"),
    pytest.param(_call(b=0), "empty arrays", id="empty-batch"),
    pytest.param(_call(sk=0), "empty arrays", id="empty-keys"),
]


@pytest.mark.parametrize("call", ACCEPTED)
def test_gate_accepts_what_cudnn_runs(call: dict[str, Any]) -> None:
    assert shape_problem(**call) is None


@pytest.mark.parametrize(("call", "reason"), REFUSED)
def test_gate_refuses_with_a_reason(call: dict[str, Any], reason: str) -> None:
    problem = shape_problem(**call)
    assert problem is not None and reason in problem


def test_gate_head_dim_limit_before_hopper() -> None:
    assert shape_problem(**_call(d=256), max_head_dim=128) is not None
    assert shape_problem(**_call(d=128), max_head_dim=128) is None


def test_gate_needs_an_nvidia_gpu_here() -> None:
    if jax.default_backend() != "gpu":
        assert _cudnn_attention.capability(**_call()) == "needs an NVIDIA GPU (cuDNN)"


@pytest.mark.parametrize(
    ("causal", "window", "expected"),
    [
        (False, None, {"is_causal": False, "local_window_size": None}),
        (True, None, {"is_causal": True, "local_window_size": None}),
        (True, (16, 0), {"is_causal": True, "local_window_size": (16, 0)}),
        (False, (16, 0), {"is_causal": True, "local_window_size": (16, 0)}),  # (left, 0) is causal + left
    ],
)
def test_argument_mapping(causal: bool, window: tuple[int, int] | None, expected: dict[str, Any]) -> None:
    mapped = cudnn_arguments(causal=causal, softmax_scale=0.25, sliding_window=window)
    assert mapped == {"scale": 0.25, "implementation": "cudnn", **expected}


def test_cpu_calls_never_reach_cudnn() -> None:
    if jax.default_backend() == "gpu":
        pytest.skip("checks the CPU path")
    q = jnp.ones((1, 8, 2, 16), BF16)
    found = ejk.explain("flash_attention", q, q, q, causal=True)
    (cudnn,) = [r for r in found.implementations if r.label == "xla/gpu:cudnn"]
    assert cudnn.status == "refused" and "default backend is cpu" in (cudnn.reason or "")
    assert found.chosen is not None and found.chosen.implementation == "chunked"


@pytest.mark.parametrize(("d", "dv", "options"), [(192, 128, {"causal": True}), (64, 128, {}),
                                                   (96, 64, {"sliding_window": (5, 0)})])
def test_head_dims_that_differ_run_zero_padded(monkeypatch: pytest.MonkeyPatch, d: int, dv: int,
                                               options: dict[str, Any]) -> None:
    """cuDNN through jax takes one head dim: the narrower side is zero-padded and the output sliced, values
    and gradients unchanged (on the CPU, jax's XLA attention stands in for cuDNN and checks it got one)."""
    original = jax.nn.dot_product_attention
    widths: list[int] = []

    def one_head_dim(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        assert q.shape[-1] == k.shape[-1] == v.shape[-1]  # what jax's cuDNN call requires
        widths.append(int(v.shape[-1]))
        return original(q, k, v, **{**kwargs, "implementation": None})

    monkeypatch.setattr(jax.nn, "dot_product_attention", one_head_dim)
    keys = jax.random.split(jax.random.key(3), 4)
    q = jax.random.normal(keys[0], (2, 24, 4, d), jnp.float32)
    k = jax.random.normal(keys[1], (2, 24, 2, d), jnp.float32)
    v = jax.random.normal(keys[2], (2, 24, 2, dv), jnp.float32)
    window = options.get("sliding_window")
    causal = bool(options.get("causal", False))

    def ours(q: Any, k: Any, v: Any) -> Any:
        return _cudnn_attention.cudnn_attention(q, k, v, causal=causal, softmax_scale=d ** -0.5,
                                                sliding_window=window, logits_soft_cap=None, q_segment_ids=None,
                                                kv_segment_ids=None, bias=None)

    def ref(q: Any, k: Any, v: Any) -> Any:
        return reference_flash_attention(q, k, v, **options)

    cotangent = jax.random.normal(keys[3], (2, 24, 4, dv), jnp.float32)
    out, grads = values_and_grads(ours, (q, k, v), cotangent=cotangent)
    want, want_grads = values_and_grads(ref, (q, k, v), cotangent=cotangent)
    assert out.shape == (2, 24, 4, dv) and widths and set(widths) == {max(d, dv)}
    assert_close(out, want, jnp.float32)
    for name, got, expected in zip("qkv", grads, want_grads, strict=True):
        assert got.shape == expected.shape
        assert_close(got, expected, jnp.float32, what=f"d{name}")


# -- numerics on the GPU ------------------------------------------------------------------------------

GPU_CASES = [
    ((2, 256, 8, 256, 2, 128), {}),
    ((2, 256, 8, 256, 8, 64), {"causal": True}),
    ((1, 250, 4, 250, 1, 256), {"causal": True}),
    ((1, 2, 4, 1024, 2, 128), {}),
    ((2, 256, 4, 256, 2, 128), {"sliding_window": (32, 0)}),
    ((2, 256, 4, 256, 2, 128), {"causal": True, "sliding_window": (17, 9)}),
    ((1, 64, 4, 512, 4, 128), {}),
    ((2, 128, 4, 128, 2, 64), {"bias": (1, 4, 128, 128)}),
    ((2, 128, 4, 128, 2, 64), {"bias": (2, 1, 128, 128)}),
    ((2, 256, 8, 256, 2, 192, 128), {"causal": True}),  # DeepSeek's prefill head dims, zero-padded v
    ((1, 128, 4, 128, 4, 64, 128), {}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize(("shape", "options"), GPU_CASES)
def test_cudnn_matches_the_reference_on_gpu(shape: tuple[int, ...], options: dict[str, Any], dtype: Any) -> None:
    if jax.default_backend() != "gpu":
        pytest.skip("needs an NVIDIA GPU")
    b, sq, hq, sk, hkv, d, *rest = shape
    dv = rest[0] if rest else d
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (b, sq, hq, d), dtype)
    k = jax.random.normal(keys[1], (b, sk, hkv, d), dtype)
    v = jax.random.normal(keys[2], (b, sk, hkv, dv), dtype)
    options = dict(options)
    bias = jax.random.normal(keys[3], options.pop("bias"), dtype) if "bias" in options else None
    found = ejk.explain("flash_attention", q, k, v, bias=bias, platform="xla", **options)
    assert found.chosen is not None and found.chosen.implementation == "cudnn", found

    def ours(q: Any, k: Any, v: Any, bias: Any) -> Any:
        return ejk.flash_attention(q, k, v, bias=bias, platform="xla", **options)

    def ref(q: Any, k: Any, v: Any, bias: Any) -> Any:
        return reference_flash_attention(q, k, v, bias=bias, **options)

    # One jitted program each (values_and_grads): eager vjps compile every primitive on its own.
    cotangent = jax.random.normal(jax.random.key(1), q.shape[:3] + v.shape[3:], dtype)
    out, ours_grads = values_and_grads(ours, (q, k, v, bias), cotangent=cotangent)
    want, ref_grads = values_and_grads(ref, (q, k, v, bias), cotangent=cotangent)
    assert_close(out, want, dtype)
    for name, got, expected in zip("qkvb", ours_grads, ref_grads, strict=True):
        if expected is not None:
            assert_close(got, expected, dtype, what=f"d{name}")


@pytest.mark.gpu
def test_masked_rows_go_elsewhere_and_are_zeros_on_gpu() -> None:
    """Sq > Sk causal leaves leading rows without keys: cuDNN refuses, the contract's zeros come back."""
    if jax.default_backend() != "gpu":
        pytest.skip("needs an NVIDIA GPU")
    q = jax.random.normal(jax.random.key(0), (1, 64, 4, 128), BF16)
    k = jax.random.normal(jax.random.key(1), (1, 16, 4, 128), BF16)
    found = ejk.explain("flash_attention", q, k, k, causal=True)
    assert found.chosen is not None and found.chosen.implementation != "cudnn"
    out = ejk.flash_attention(q, k, k, causal=True)
    assert float(jnp.max(jnp.abs(out[:, : 64 - 16].astype(jnp.float32)))) == 0.0
    assert_close(out, reference_flash_attention(q, k, k, causal=True), BF16)
