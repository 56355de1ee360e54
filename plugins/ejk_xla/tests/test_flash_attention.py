"""The XLA flash attention against the materialised reference: values, gradients, transforms, memory."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejk.ops.validate import check_flash_attention_args
from ejk.testing import (
    AttentionCase,
    assert_close,
    attention_mask,
    attention_values_and_grads,
    fast_jit,
    reference_flash_attention,
)
from ejk_xla._flash_attention import (
    FlashAttentionConfig,
    config_space,
    flash_attention,
    heuristic_config,
)

pytestmark = pytest.mark.filterwarnings("error")


@attrs.frozen(kw_only=True)
class Case(AttentionCase):
    """An attention problem (see :class:`ejk.testing.AttentionCase`) with the chunked kernel's blocks."""

    hkv: int = 1
    bq: int = 8
    bk: int = 8

    def label_parts(self) -> list[str]:
        first, *rest = super().label_parts()
        return [first, f"blk{self.bq}x{self.bk}", *rest]


def kernel_fn(case: Case, cfg: FlashAttentionConfig | None = None):
    """The kernel with user-level static arguments normalised through the checker."""
    cfg = cfg if cfg is not None else FlashAttentionConfig(block_q=case.bq, block_k=case.bk)

    def run(q, k, v, q_segment_ids=None, kv_segment_ids=None, bias=None):
        scale, window = check_flash_attention_args(
            q, k, v, softmax_scale=None, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
            bias=bias, **case.options(),
        )
        return flash_attention(
            q, k, v, causal=case.causal, softmax_scale=scale, sliding_window=window,
            logits_soft_cap=case.cap, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
            bias=bias, cfg=cfg,
        )

    return run


def reference_fn(case: Case):
    return functools.partial(reference_flash_attention, **case.options())


def check_case(case: Case, *, grads: bool = True, seed: int = 0) -> None:
    """Kernel vs reference on random inputs: output, and (``grads``) dq, dk, dv, dbias."""
    inputs = case.inputs(seed)
    if not grads:
        got = fast_jit(kernel_fn(case))(**inputs)
        want = fast_jit(reference_fn(case))(**inputs)
        assert got.shape == want.shape and got.dtype == inputs["q"].dtype
        assert_close(got, want, case.dtype, what="out")
        return
    cot = case.cotangent()
    got, got_grads = attention_values_and_grads(kernel_fn(case), inputs, cot)
    want, want_grads = attention_values_and_grads(reference_fn(case), inputs, cot)
    assert got.dtype == inputs["q"].dtype
    assert_close(got, want, case.dtype, what="out")
    for name in want_grads:
        assert got_grads[name].shape == inputs[name].shape
        assert got_grads[name].dtype == inputs[name].dtype
        assert_close(got_grads[name], want_grads[name], case.dtype, what=f"d{name}")


def reference(q: jax.Array, k: jax.Array, v: jax.Array, **kwargs: Any) -> jax.Array:
    """The reference, jitted: static keyword arguments are Python values, arrays are traced."""
    arrays = {n: x for n, x in kwargs.items() if isinstance(x, jax.Array)}
    static = {n: x for n, x in kwargs.items() if n not in arrays}
    return fast_jit(functools.partial(reference_flash_attention, **static))(q, k, v, **arrays)


def column(values: list[float], seq_len: int) -> jax.Array:
    """``[1, seq_len, 1, 1]`` from a list (one batch, one head, head_dim 1)."""
    return jnp.asarray(np.array(values, np.float32).reshape(1, seq_len, 1, 1))


# ----------------------------------------------------------------------------------------------
# The reference itself
# ----------------------------------------------------------------------------------------------


def test_reference_hand_computed_causal_bottom_right() -> None:
    # Sq=2, Sk=3, scale 1: query 0 sits at position 1 (sees keys 0, 1); query 1 sees all three.
    q, k, v = column([1.0, 0.0], 2), column([1.0, 0.0, -1.0], 3), column([1.0, 2.0, 3.0], 3)
    out = reference(q, k, v, causal=True, softmax_scale=1.0)
    e = math.e
    expected = np.array([(e * 1 + 1 * 2) / (e + 1), (1 + 2 + 3) / 3])
    np.testing.assert_allclose(np.asarray(out).ravel(), expected, rtol=1e-6)


def test_reference_hand_computed_soft_cap_bias_window_and_empty_row() -> None:
    q, k, v = column([2.0, 1.0], 2), column([3.0, 1.0], 2), column([5.0, 7.0], 2)
    # Window (0, 0): each query sees only its own key.
    out = reference(q, k, v, softmax_scale=1.0, sliding_window=0)
    np.testing.assert_allclose(np.asarray(out).ravel(), [5.0, 7.0])
    # No mask: logits [[6, 2], [3, 1]], soft-capped at 4, then the bias is added.
    bias_np = np.array([[0.0, 1.0], [0.0, 0.0]], np.float32)
    out = reference(q, k, v, softmax_scale=1.0, logits_soft_cap=4.0, bias=jnp.asarray(bias_np[None, None]))
    logits = 4.0 * np.tanh(np.array([[6.0, 2.0], [3.0, 1.0]]) / 4.0) + bias_np
    weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(out).ravel(), weights @ np.array([5.0, 7.0]), rtol=1e-6)
    # A segment id that matches no key: that row is zeros.
    ids = dict(q_segment_ids=jnp.array([[0, 9]], jnp.int32), kv_segment_ids=jnp.array([[0, 0]], jnp.int32))
    out = reference(q, k, v, softmax_scale=1.0, **ids)
    assert float(out[0, 1, 0, 0]) == 0.0
    expected = (math.exp(6) * 5 + math.exp(2) * 7) / (math.exp(6) + math.exp(2))
    np.testing.assert_allclose(float(out[0, 0, 0, 0]), expected, rtol=1e-6)


def test_reference_gqa_head_mapping() -> None:
    inputs = Case(sq=5, sk=6, hq=4, hkv=2, d=8).inputs()
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    out = np.asarray(reference(q, k, v))
    for h in range(4):  # q head h uses kv head h // 2
        kv = slice(h // 2, h // 2 + 1)
        single = reference(q[:, :, h : h + 1], k[:, :, kv], v[:, :, kv])
        np.testing.assert_allclose(out[:, :, h : h + 1], np.asarray(single), rtol=1e-6, atol=1e-6)


def test_reference_masked_rows_have_zero_finite_gradients() -> None:
    inputs = Case(sq=4, sk=4).inputs()
    ids = dict(q_segment_ids=jnp.array([[0, 0, 5, 5]], jnp.int32), kv_segment_ids=jnp.zeros((1, 4), jnp.int32))

    def loss(q, k, v):
        return jnp.sum(reference_flash_attention(q, k, v, **ids) ** 2)

    dq, dk, dv = fast_jit(jax.grad(loss, argnums=(0, 1, 2)))(inputs["q"], inputs["k"], inputs["v"])
    for g in (dq, dk, dv):
        assert np.isfinite(np.asarray(g)).all()
    assert np.all(np.asarray(dq[:, 2:]) == 0.0)
    assert np.all(np.asarray(dq[:, :2]) != 0.0)


def test_attention_mask_alignment() -> None:
    mask = np.asarray(attention_mask(2, 4, causal=True))[0, 0]
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 1, 1, 1]])
    mask = np.asarray(attention_mask(3, 3, sliding_window=(1, 0)))[0, 0]
    np.testing.assert_array_equal(mask, [[1, 0, 0], [1, 1, 0], [0, 1, 1]])
    ids = jnp.array([[0, 1]], jnp.int32)
    mask = np.asarray(attention_mask(2, 2, causal=True, q_segment_ids=ids, kv_segment_ids=ids))
    np.testing.assert_array_equal(mask[0, 0], [[1, 0], [0, 1]])


# ----------------------------------------------------------------------------------------------
# Kernel vs reference
# ----------------------------------------------------------------------------------------------

# Hand-picked cases: every feature, ragged blocks, Sq != Sk, Sq = 1, Sk = 1, GQA ratios.
EDGE_CASES = [
    Case(b=2, sq=37, sk=53, hq=4, hkv=2, bq=16, bk=16),
    Case(b=2, sq=53, sk=37, hq=8, hkv=1, bq=16, bk=8, causal=True),
    Case(b=1, sq=37, sk=53, hq=2, hkv=2, bq=8, bk=16, causal=True),
    Case(b=1, sq=1, sk=37, hq=8, hkv=2, causal=True),
    Case(b=2, sq=19, sk=1, hq=2, hkv=1, causal=True),
    Case(b=1, sq=1, sk=1, hq=1, hkv=1),
    Case(b=1, sq=40, sk=40, hq=2, hkv=1, window=(5, 3), bq=8, bk=8),
    Case(b=1, sq=33, sk=47, hq=4, hkv=4, window=4, causal=True, bq=8, bk=16),
    Case(b=2, sq=24, sk=24, hq=4, hkv=2, cap=3.0, seg=True, bias="BHQK", causal=True, bq=16, bk=8),
    Case(b=2, sq=21, sk=29, hq=4, hkv=1, seg=True, bias="11Q1", bq=8, bk=8),
    Case(b=2, sq=21, sk=29, hq=4, hkv=2, bias="1H1K", window=(7, 2), bq=16, bk=16),
    Case(b=2, sq=12, sk=20, hq=2, hkv=1, bias="B1QK", cap=1.5, bq=64, bk=64),  # blocks larger than sequences
    Case(b=1, sq=16, sk=16, hq=2, hkv=1, d=64, dv=32, causal=True),
    Case(b=1, sq=9, sk=16, hq=2, hkv=2, d=128, bq=4, bk=16),
]


@pytest.mark.parametrize("case", EDGE_CASES, ids=str)
def test_kernel_matches_reference(case: Case) -> None:
    check_case(case, grads=True)


def _random_cases(n: int, seed: int, dims: tuple[int, ...] = (8, 16, 32)) -> list[Case]:
    rng = np.random.default_rng(seed)
    heads = [(1, 1), (2, 1), (2, 2), (4, 2), (8, 1), (8, 8)]
    windows = [None, None, 3, (0, 6), (9, 1), (0, 0)]
    biases = [None, None, "BHQK", "1HQ1", "B11K", "1111"]
    cases = []
    for _ in range(n):
        hq, hkv = heads[rng.integers(len(heads))]
        cases.append(
            Case(
                b=int(rng.integers(1, 3)),
                sq=int(rng.choice([1, 5, 16, 29, 48])),
                sk=int(rng.choice([1, 7, 16, 33, 48])),
                hq=hq,
                hkv=hkv,
                d=int(rng.choice(dims)),
                causal=bool(rng.integers(2)),
                window=windows[rng.integers(len(windows))],
                cap=[None, 2.0][rng.integers(2)],
                seg=bool(rng.integers(2)),
                bias=biases[rng.integers(len(biases))],
                bq=int(rng.choice([4, 8, 16, 32])),
                bk=int(rng.choice([4, 8, 16, 32])),
            )
        )
    return cases


@pytest.mark.parametrize("case", _random_cases(16, seed=2024), ids=str)
def test_kernel_matches_reference_random(case: Case) -> None:
    check_case(case, grads=True)


@pytest.mark.parametrize("case", _random_cases(12, seed=7, dims=(16, 32, 64, 128)), ids=str)
def test_kernel_forward_random(case: Case) -> None:
    check_case(case, grads=False)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    "case",
    [
        Case(b=2, sq=33, sk=40, hq=4, hkv=2, d=32, causal=True, bq=16, bk=8),
        Case(b=1, sq=24, sk=17, hq=2, hkv=1, d=16, window=(4, 4), cap=5.0, seg=True, bias="1HQK", bq=8, bk=8),
    ],
    ids=str,
)
def test_kernel_low_precision(case: Case, dtype: str) -> None:
    check_case(attrs.evolve(case, dtype=dtype), grads=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_fully_masked_rows_are_zero_with_zero_gradients(dtype: str) -> None:
    # Query i sits at position i + 4 (Sq=8, Sk=12, causal); keys 0-5 are segment 0, keys 6-11 segment 1.
    # Rows 1 and 6 carry an id no key has; row 0 (segment 1, position 4) sees only segment-0 keys.
    case = Case(b=1, sq=8, sk=12, hq=2, hkv=1, seg=True, causal=True, bq=4, bk=4, dtype=dtype)
    inputs = case.inputs()
    inputs["q_segment_ids"] = jnp.array([[1, 7, 0, 0, 1, 1, 7, 0]], jnp.int32)
    inputs["kv_segment_ids"] = jnp.array([[0] * 6 + [1] * 6], jnp.int32)
    cot = case.cotangent()
    out, grads = attention_values_and_grads(kernel_fn(case), inputs, cot)
    want, want_grads = attention_values_and_grads(reference_fn(case), inputs, cot)
    masked = np.array([1, 1, 0, 0, 0, 0, 1, 0], bool)
    out32, dq32 = np.asarray(out, np.float32), np.asarray(grads["q"], np.float32)
    assert np.all(out32[:, masked] == 0.0) and np.all(out32[:, ~masked] != 0.0)
    assert np.all(dq32[:, masked] == 0.0)
    assert_close(out, want, dtype, what="out")
    for name in ("q", "k", "v"):
        assert_close(grads[name], want_grads[name], dtype, what=f"d{name}")


def test_window_that_excludes_everything() -> None:
    # Non-causal window (0, 0) with Sq=12 > Sk=4: query i sits at i - 8, so rows 0-7 see nothing.
    case = Case(b=1, sq=12, sk=4, hq=2, hkv=1, window=(0, 0), bq=4, bk=4)
    inputs = case.inputs()
    cot = case.cotangent()
    out, grads = attention_values_and_grads(kernel_fn(case), inputs, cot)
    want, want_grads = attention_values_and_grads(reference_fn(case), inputs, cot)
    assert np.all(np.asarray(out[:, :8]) == 0.0) and np.all(np.asarray(out[:, 8:]) != 0.0)
    assert np.all(np.asarray(grads["q"][:, :8]) == 0.0)
    assert_close(out, want, "float32", what="out")
    for name in ("q", "k", "v"):
        assert_close(grads[name], want_grads[name], "float32", what=f"d{name}")


def test_bias_minus_inf_row_is_zero_and_finite() -> None:
    case = Case(b=1, sq=6, sk=6, hq=1, hkv=1, bias="11QK", bq=4, bk=4)
    inputs = case.inputs()
    bias = np.array(inputs["bias"])
    bias[0, 0, 2] = -np.inf  # a whole row
    bias[0, 0, 4, :3] = -np.inf  # part of a row
    inputs["bias"] = jnp.asarray(bias)
    cot = case.cotangent()
    out, grads = attention_values_and_grads(kernel_fn(case), inputs, cot)
    want, want_grads = attention_values_and_grads(reference_fn(case), inputs, cot)
    assert np.all(np.asarray(out[:, 2]) == 0.0)
    assert_close(out, want, "float32", what="out")
    for name in ("q", "k", "v", "bias"):
        assert_close(grads[name], want_grads[name], "float32", what=f"d{name}")


def test_empty_sequences_give_empty_or_zero_output() -> None:
    q = jnp.ones((1, 3, 2, 8))
    kv = jnp.ones((1, 0, 1, 8))
    kw = dict(causal=False, softmax_scale=0.5, sliding_window=None, logits_soft_cap=None,
              q_segment_ids=None, kv_segment_ids=None, bias=None)
    out = flash_attention(q, kv, kv, **kw)
    assert out.shape == (1, 3, 2, 8) and np.all(np.asarray(out) == 0.0)
    assert flash_attention(q[:, :0], q[:, :, :1], q[:, :, :1], **kw).shape == (1, 0, 2, 8)


def test_default_config_and_tiny_blocks() -> None:
    case = Case(b=1, sq=70, sk=90, hq=2, hkv=1, causal=True, window=(20, 0))
    inputs = case.inputs()
    want = fast_jit(reference_fn(case))(**inputs)
    default = heuristic_config(inputs["q"], inputs["k"], inputs["v"])
    got_default = fast_jit(kernel_fn(case, cfg=default))(**inputs)
    got_small = fast_jit(kernel_fn(case, cfg=FlashAttentionConfig(block_q=3, block_k=7)))(**inputs)
    assert_close(got_default, want, "float32", what="heuristic cfg")
    assert_close(got_small, want, "float32", what="3x7 blocks")


# ----------------------------------------------------------------------------------------------
# Transformations
# ----------------------------------------------------------------------------------------------


def test_vmap_jit_grad_compose() -> None:
    case = Case(b=1, sq=20, sk=24, hq=4, hkv=2, causal=True, seg=True, bias="1HQK", bq=8, bk=8)
    per = [case.inputs(seed) for seed in range(3)]
    names = ("q", "k", "v", "q_segment_ids", "kv_segment_ids", "bias")
    args = [jnp.stack([p[n] for p in per]) for n in names]
    kernel = kernel_fn(case)

    def ref(q, k, v, q_segment_ids, kv_segment_ids, bias):
        return reference_fn(case)(q, k, v, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=bias)

    def loss(fn, *arrays):
        return jnp.sum(jnp.sin(jax.vmap(fn)(*arrays)))

    grad_args = (0, 1, 2, 5)
    got = fast_jit(jax.grad(functools.partial(loss, kernel), argnums=grad_args))(*args)
    want = fast_jit(jax.grad(functools.partial(loss, ref), argnums=grad_args))(*args)
    for g, w, name in zip(got, want, "qkvb", strict=True):
        assert_close(g, w, "float32", what=f"vmap grad d{name}")
    # vmap over q only, k and v shared (in_axes None); plain (unjitted) grad through a jitted kernel.
    out = fast_jit(jax.vmap(kernel, in_axes=(0, None, None)))(args[0], per[0]["k"], per[0]["v"])
    ref_out = fast_jit(jax.vmap(ref, in_axes=(0, None, None, None, None, None)))(
        args[0], per[0]["k"], per[0]["v"], None, None, None
    )
    assert_close(out, ref_out, "float32", what="vmap in_axes None")
    jitted = jax.jit(kernel)  # compiler_options are only allowed on a top-level jit
    dq = jax.grad(lambda q: jnp.sum(jitted(q, per[0]["k"], per[0]["v"]) ** 2))(per[0]["q"])
    dq_ref = fast_jit(jax.grad(lambda q: jnp.sum(ref(q, per[0]["k"], per[0]["v"], None, None, None) ** 2)))(
        per[0]["q"]
    )
    assert_close(dq, dq_ref, "float32", what="grad of jit")


# ----------------------------------------------------------------------------------------------
# Memory: no [Sq, Sk] buffer anywhere
# ----------------------------------------------------------------------------------------------


def _largest_tensor(hlo_text: str) -> int:
    """Element count of the largest ``tensor<...>`` type in StableHLO text."""
    shapes = re.findall(r"tensor<((?:\d+x)+)[a-z]", hlo_text)
    return max(math.prod(int(d) for d in s.rstrip("x").split("x")) for s in shapes)


@pytest.mark.parametrize("mode", ["forward", "backward"])
def test_no_quadratic_buffer(mode: str) -> None:
    seq, heads, dim, block = 8192, 2, 16, 256
    spec = jax.ShapeDtypeStruct((1, seq, heads, dim), jnp.float32)
    case = Case(sq=seq, sk=seq, hq=heads, hkv=heads, d=dim, causal=True, bq=block, bk=block)
    kernel = kernel_fn(case)
    fn = kernel if mode == "forward" else jax.grad(lambda *a: jnp.sum(kernel(*a)), argnums=(0, 1, 2))
    lowered = jax.jit(fn).lower(spec, spec, spec)
    quadratic = seq * seq
    # Nothing in the program is larger than the inputs or one block of logits for all heads.
    largest = _largest_tensor(lowered.as_text())
    assert largest <= max(seq * heads * dim, heads * block * block) < quadratic // 64
    # XLA's own buffer assignment: temporaries are linear in seq (a [Sq, Sk] f32 would be 256 MiB).
    temp = lowered.compile().memory_analysis().temp_size_in_bytes
    assert temp < quadratic * 4 // 32, f"temp buffers of {temp} bytes look quadratic"
    # The check does see a quadratic buffer when there is one (the reference materialises it).
    ref_text = jax.jit(reference_fn(case)).lower(spec, spec, spec).as_text()
    assert _largest_tensor(ref_text) >= quadratic


# ----------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------


def test_config_space_and_heuristic() -> None:
    big = jax.ShapeDtypeStruct((2, 4096, 8, 128), jnp.bfloat16)
    space = config_space(big, big, big)
    assert 2 <= len(space) <= 8 and len(set(space)) == len(space)
    assert all(isinstance(c, FlashAttentionConfig) for c in space)
    small = jax.ShapeDtypeStruct((1, 100, 2, 64), jnp.float32)
    decode = jax.ShapeDtypeStruct((1, 1, 2, 64), jnp.float32)
    for q, k in ((small, small), (decode, big)):
        space = config_space(q, k, k)
        assert len(set(space)) == len(space) >= 1
        assert all(c.block_q <= q.shape[1] and c.block_k <= k.shape[1] for c in space)
        cfg = heuristic_config(q, k, k)
        assert cfg.block_q <= q.shape[1] and cfg.block_k <= k.shape[1]
    assert config_space(decode, decode, decode) == [FlashAttentionConfig(block_q=1, block_k=1)]


@pytest.mark.parametrize("bad", [0, -4, 2.5, True, None])
def test_config_validation(bad: Any) -> None:
    with pytest.raises(ValueError, match="block_q"):
        FlashAttentionConfig(block_q=bad, block_k=8)


# ----------------------------------------------------------------------------------------------
# Argument checking
# ----------------------------------------------------------------------------------------------


def _sds(shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _check(q=None, k=None, v=None, **overrides: Any) -> tuple[float, tuple[int, int] | None]:
    kwargs: dict[str, Any] = dict(
        causal=False, softmax_scale=None, sliding_window=None, logits_soft_cap=None,
        q_segment_ids=None, kv_segment_ids=None, bias=None,
    )
    kwargs.update(overrides)
    q = q if q is not None else _sds((2, 16, 8, 64))
    k = k if k is not None else _sds((2, 32, 2, 64))
    v = v if v is not None else _sds((2, 32, 2, 32))
    return check_flash_attention_args(q, k, v, **kwargs)


def test_checker_normalises() -> None:
    assert _check() == (pytest.approx(1 / 8), None)
    assert _check(softmax_scale=2)[0] == 2.0
    assert _check(sliding_window=5)[1] == (5, 5)
    assert _check(sliding_window=(3, 7), causal=True)[1] == (3, 0)
    assert _check(sliding_window=[0, 2])[1] == (0, 2)
    ids_q, ids_k = _sds((2, 16), jnp.int32), _sds((2, 32), jnp.int32)
    _check(q_segment_ids=ids_q, kv_segment_ids=ids_k, bias=_sds((1, 8, 1, 32)), logits_soft_cap=30.0)


def test_checker_works_on_tracers() -> None:
    q, k = jnp.ones((1, 4, 2, 8)), jnp.ones((1, 6, 1, 8))

    @jax.jit
    def f(q, k):
        scale, _ = check_flash_attention_args(
            q, k, k, causal=True, softmax_scale=None, sliding_window=None, logits_soft_cap=None,
            q_segment_ids=None, kv_segment_ids=None, bias=None,
        )
        return q * scale

    assert float(f(q, k)[0, 0, 0, 0]) == pytest.approx(1 / math.sqrt(8))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(q=_sds((2, 16, 8))), r"q has shape \(2, 16, 8\) but needs rank 4"),
        (
            dict(k=_sds((2, 32, 3, 64))),
            r"k has shape \(2, 32, 3, 64\).*q heads \(8\) must be a multiple of kv heads \(3\)",
        ),
        (
            dict(k=_sds((3, 32, 2, 64))),
            r"k has shape \(3, 32, 2, 64\) but needs \[batch=2, seq_k, kv_heads, head_dim=64\]",
        ),
        (dict(k=_sds((2, 32, 2, 48))), r"k has shape .*head_dim=64"),
        (dict(k=_sds((2, 32, 2, 64, 1))), r"k has shape .* needs rank 4"),
        (dict(v=_sds((2, 31, 2, 32))), r"v has shape \(2, 31, 2, 32\) but needs \[batch=2, seq_k=32, kv_heads=2"),
        (dict(v=_sds((2, 32, 2))), r"v has shape .* needs rank 4"),
        (dict(q=_sds((2, 16, 8, 64), jnp.int32)), r"q has dtype int32"),
        (dict(v=_sds((2, 32, 2, 32), jnp.bfloat16)), r"q, k, v have dtypes .*float32.*bfloat16"),
        (dict(q=np.float32(1.0).item()), r"q must be an array"),
        (dict(q_segment_ids=_sds((2, 16), jnp.int32)), r"q_segment_ids was given alone"),
        (dict(kv_segment_ids=_sds((2, 32), jnp.int32)), r"kv_segment_ids was given alone"),
        (
            dict(q_segment_ids=_sds((2, 15), jnp.int32), kv_segment_ids=_sds((2, 32), jnp.int32)),
            r"q_segment_ids has shape \(2, 15\) but needs \[batch, seq\] = \(2, 16\)",
        ),
        (
            dict(q_segment_ids=_sds((2, 16), jnp.int32), kv_segment_ids=_sds((2, 32), jnp.float32)),
            r"kv_segment_ids has dtype float32 but needs an integer dtype",
        ),
        (dict(bias=_sds((2, 8, 16))), r"bias has shape \(2, 8, 16\) but needs rank 4"),
        (dict(bias=_sds((2, 4, 16, 32))), r"bias has shape \(2, 4, 16, 32\) .*broadcastable to .*\(2, 8, 16, 32\)"),
        (dict(bias=_sds((1, 1, 16, 32), jnp.int32)), r"bias has dtype int32"),
        (dict(sliding_window=-1), r"sliding_window is -1 but needs non-negative"),
        (dict(sliding_window=(1, 2, 3)), r"sliding_window is \(1, 2, 3\)"),
        (dict(sliding_window=(1.5, 2)), r"sliding_window is \(1.5, 2\)"),
        (dict(sliding_window=True), r"sliding_window is True"),
        (dict(logits_soft_cap=0.0), r"logits_soft_cap is 0.0 but needs a finite number > 0"),
        (dict(logits_soft_cap=-2.0), r"logits_soft_cap is -2.0"),
        (dict(logits_soft_cap=math.inf), r"logits_soft_cap is inf"),
        (dict(softmax_scale=math.nan), r"softmax_scale is nan but needs a finite"),
        (dict(softmax_scale="0.1"), r"softmax_scale is '0.1'"),
        (dict(causal=1), r"causal is 1 but needs a bool"),
    ],
)
def test_checker_errors(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=f"^flash_attention: {match}"):
        _check(**overrides)
