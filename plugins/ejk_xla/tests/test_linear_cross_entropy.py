"""The XLA linear cross-entropies (chunked, gradients in forward): float64 oracle, every option, chunking,
labels, which backward runs, memory, validation."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.ops import ImplChoice, get_op
from ejk.testing import assert_close, check_linear_cross_entropy
from ejk.testing import reference_linear_cross_entropy as reference
from ejk_xla import LinearCrossEntropyConfig
from ejk_xla import _lce_grad_in_forward as gif
from ejk_xla._lce_grad_in_forward import GradInForwardConfig

pytestmark = pytest.mark.filterwarnings("error")

#: Tiles smaller than the shapes below, and not dividing them: every chunking path runs.
SMALL = LinearCrossEntropyConfig(block_t=4, block_v=16)


def _float64_loss_and_grads(x: np.ndarray, w: np.ndarray, labels: np.ndarray, *, ignore_index: int = -100,
                            reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                            logit_soft_cap: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The loss and its gradients for a cotangent of ones, in float64 NumPy, derived by hand."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    u = x64 @ w64
    z = u if logit_soft_cap is None else logit_soft_cap * np.tanh(u / logit_soft_cap)
    vocab = w.shape[1]
    top = z.max(axis=1, keepdims=True)
    lse = (top + np.log(np.exp(z - top).sum(axis=1, keepdims=True)))[:, 0]
    valid = (labels != ignore_index) & (labels >= 0) & (labels < vocab)
    safe = np.where(valid, labels, 0)
    z_y = z[np.arange(len(labels)), safe]
    per = (1 - label_smoothing) * (lse - z_y) + label_smoothing * (lse - z.mean(axis=1)) + z_loss * lse**2
    per = np.where(valid, per, 0.0)
    weight = np.where(valid, 1.0, 0.0)
    if reduction == "mean":
        weight = weight / max(valid.sum(), 1)
    loss = per if reduction == "none" else (per * weight).sum()
    p = np.exp(z - lse[:, None])
    dz = p * (1 + 2 * z_loss * lse)[:, None] - label_smoothing / vocab
    dz[np.arange(len(labels)), safe] -= 1 - label_smoothing
    dz *= weight[:, None]
    if logit_soft_cap is not None:
        dz *= 1 - (z / logit_soft_cap) ** 2
    return loss, dz @ w64.T, x64.T @ dz


OPTIONS = [
    {},
    {"reduction": "sum", "label_smoothing": 0.1},
    {"reduction": "none", "z_loss": 1e-2},
    {"logit_soft_cap": 4.0, "label_smoothing": 0.3, "z_loss": 1e-3, "ignore_index": 3},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "plain")
def test_matches_a_float64_oracle(options: dict[str, Any]) -> None:
    rng = np.random.default_rng(0)
    t, h, v = 11, 8, 37  # neither divides the 4 x 16 tiles
    x = rng.standard_normal((t, h)).astype(np.float32)
    w = rng.standard_normal((h, v)).astype(np.float32)
    labels = rng.integers(0, v, t).astype(np.int32)
    labels[::4] = options.get("ignore_index", -100)

    def loss(x: jax.Array, w: jax.Array) -> jax.Array:
        out = ejk.linear_cross_entropy(x, w, jnp.asarray(labels), platform="xla", cfg=SMALL, **options)
        return out.sum() if out.ndim else out

    value, (dx, dw) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)
    want, want_dx, want_dw = _float64_loss_and_grads(x, w, labels, **options)
    want_value = np.sum(want) if np.ndim(want) else want
    assert value.dtype == jnp.float32
    for got, ref in ((value, want_value), (dx, want_dx), (dw, want_dw)):
        np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=2e-5, atol=2e-5)


def test_bfloat16_inputs_match_the_float64_oracle_of_their_values() -> None:
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((9, 16)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((16, 40)) / 4, jnp.bfloat16)
    labels = rng.integers(0, 40, 9).astype(np.int32)
    value, (dx, dw) = jax.value_and_grad(
        lambda x, w: ejk.linear_cross_entropy(x, w, jnp.asarray(labels), platform="xla", cfg=SMALL),
        argnums=(0, 1))(x, w)
    assert (dx.dtype, dw.dtype) == (jnp.bfloat16, jnp.bfloat16)
    want, want_dx, want_dw = _float64_loss_and_grads(np.asarray(x, np.float32), np.asarray(w, np.float32), labels)
    assert_close(value, want, jnp.bfloat16, what="loss")
    assert_close(dx, want_dx, jnp.bfloat16, what="dx")
    assert_close(dw, want_dw, jnp.bfloat16, what="dw")


def test_conformance_with_tiles_smaller_than_the_shapes() -> None:
    assert check_linear_cross_entropy("xla", dtypes=(jnp.float32,), cfg=SMALL) == 7


def test_conformance_bfloat16() -> None:
    from ejk.testing import LINEAR_CROSS_ENTROPY_CASES as CASES

    assert check_linear_cross_entropy("xla", dtypes=(jnp.bfloat16,), cfg=SMALL, cases=CASES[:4]) == 4


def test_ignored_everywhere_gives_zero_loss_and_zero_gradients() -> None:
    x, w = jnp.ones((5, 4)), jnp.ones((4, 7))
    labels = jnp.full((5,), -100, jnp.int32)
    for reduction in ("mean", "sum"):
        value, grads = jax.value_and_grad(
            lambda x, w, r=reduction: ejk.linear_cross_entropy(x, w, labels, reduction=r, platform="xla"),
            argnums=(0, 1))(x, w)
        assert float(value) == 0.0 and not np.any(grads[0]) and not np.any(grads[1])


def test_labels_outside_the_vocabulary_are_an_error_eagerly_and_ignored_under_jit() -> None:
    rng = np.random.default_rng(2)
    x, w = jnp.asarray(rng.standard_normal((6, 4)), jnp.float32), jnp.asarray(rng.standard_normal((4, 10)), jnp.float32)
    labels = jnp.asarray([1, 10, -1, 3, -100, 9], jnp.int32)
    with pytest.raises(ValueError, match=r"labels holds values outside \[0, V=10\).*\[1\]=10, \[2\]=-1"):
        ejk.linear_cross_entropy(x, w, labels, platform="xla")
    jitted = jax.jit(lambda x, w, labels: ejk.linear_cross_entropy(x, w, labels, reduction="none", platform="xla"))
    got = jitted(x, w, labels)
    marked = jnp.where((labels < 0) | (labels >= 10), -100, labels)
    np.testing.assert_allclose(got, reference(x, w, marked, reduction="none"), rtol=2e-5, atol=2e-5)
    assert float(got[1]) == float(got[2]) == 0.0


def test_no_tokens() -> None:
    x, w = jnp.zeros((0, 8)), jnp.ones((8, 5))
    labels = jnp.zeros((0,), jnp.int32)
    assert float(ejk.linear_cross_entropy(x, w, labels, platform="xla")) == 0.0
    assert ejk.linear_cross_entropy(x, w, labels, reduction="none", platform="xla").shape == (0,)
    dx, dw = jax.grad(lambda x, w: ejk.linear_cross_entropy(x, w, labels, platform="xla"), argnums=(0, 1))(x, w)
    assert dx.shape == (0, 8) and not np.any(dw)


@functools.cache  # the unfused program is compiled once for both memory tests
def _temp_bytes(fn: Any, t: int, h: int, v: int) -> int:
    args = (jax.ShapeDtypeStruct((t, h), jnp.float32), jax.ShapeDtypeStruct((h, v), jnp.float32),
            jax.ShapeDtypeStruct((t,), jnp.int32))
    compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(*args).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def test_forward_and_backward_temporary_memory_does_not_grow_with_tokens_times_vocab() -> None:
    cfg = LinearCrossEntropyConfig(block_t=128, block_v=1024)

    def fused(x: jax.Array, w: jax.Array, labels: jax.Array) -> jax.Array:
        return ejk.linear_cross_entropy(x, w, labels, platform="xla", cfg=cfg)

    h = 32
    small = _temp_bytes(fused, 512, h, 4096)
    large = _temp_bytes(fused, 2048, h, 16384)  # 16x the logits
    unfused = _temp_bytes(reference, 2048, h, 16384)
    assert unfused > 2048 * 16384 * 4  # the materialised logits, at least
    assert large <= 0.05 * unfused, (large, unfused)
    # What grows is O(T·H) (the float32 dx accumulator) and O(H·V) (a gradient buffer), never T·V.
    assert large - small <= 8 * (2048 * h + h * 16384), (small, large)


def test_explicit_precision_and_config_space() -> None:
    from ejk_xla._linear_cross_entropy import config_space

    x, w = jnp.ones((8, 4)), jnp.ones((4, 6))
    assert len(config_space(x, w)) == 1  # every candidate clips to the whole (tiny) problem
    assert len(config_space(jax.ShapeDtypeStruct((4096, 8), jnp.bfloat16),
                            jax.ShapeDtypeStruct((8, 65536), jnp.bfloat16))) == 9
    labels = jnp.arange(8, dtype=jnp.int32) % 6
    got = ejk.linear_cross_entropy(x, w, labels, precision="default", platform="xla")
    np.testing.assert_allclose(got, np.log(6.0), rtol=1e-6)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: ejk.linear_cross_entropy(jnp.ones((4,)), jnp.ones((4, 3)), jnp.zeros(4, jnp.int32)),
     r"x has shape \(4,\) but needs \[T, H\]"),
    (lambda: ejk.linear_cross_entropy(jnp.ones((4, 5)), jnp.ones((3, 5)), jnp.zeros(4, jnp.int32)),
     r"w has shape \(3, 5\) but needs \[H=5, V\].*embedding.T"),
    (lambda: ejk.linear_cross_entropy(jnp.ones((4, 3)), jnp.ones((3, 5)), jnp.zeros(3, jnp.int32)),
     r"labels has shape \(3,\) but needs \[T=4\]"),
    (lambda: ejk.linear_cross_entropy(jnp.ones((4, 3)), jnp.ones((3, 5)), jnp.zeros(4)),
     r"labels has dtype float32 but needs an integer dtype"),
    (lambda: ejk.linear_cross_entropy(jnp.ones((4, 3)), jnp.ones((3, 0)), jnp.zeros(4, jnp.int32)),
     r"V >= 1"),
    (lambda: ejk.linear_cross_entropy(jnp.ones((4, 3)), jnp.ones((3, 5)), jnp.zeros(4, jnp.int32), reduction="avg"),
     r"reduction is 'avg' but needs one of 'mean', 'sum', 'none'"),
    (lambda: ejk.linear_cross_entropy(jnp.ones((4, 3)), jnp.ones((3, 5)), jnp.zeros(4, jnp.int32),
                                      label_smoothing=1.5), r"label_smoothing is 1.5 but needs a number in \[0, 1\]"),
    (lambda: ejk.linear_cross_entropy(jnp.ones((4, 3)), jnp.ones((3, 5)), jnp.zeros(4, jnp.int32), z_loss=-1.0),
     r"z_loss is -1.0 but needs a finite number >= 0"),
    (lambda: ejk.linear_cross_entropy(jnp.ones((4, 3)), jnp.ones((3, 5)), jnp.zeros(4, jnp.int32),
                                      logit_soft_cap=0.0), r"logit_soft_cap is 0.0 but needs a finite number > 0"),
    (lambda: ejk.linear_cross_entropy(jnp.ones((4, 3)), jnp.ones((3, 5)), jnp.zeros(4, jnp.int32),
                                      ignore_index=1.5), r"ignore_index is 1.5 but needs an int"),
    (lambda: ejk.linear_cross_entropy(np.ones((4, 3)), jnp.ones((3, 5)), jnp.zeros(4, jnp.int32)),
     r"x has dtype float64 but needs .*cast to float32"),
])
def test_bad_arguments_are_named(call: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


# -- grad_in_forward: the gradients computed in the forward pass --------------------------------------


def _gif_choice(block_t: int = 4, logits: str = "float32") -> ImplChoice:
    """Chunks of ``block_t`` tokens, not dividing the shapes below; the fallback's tiles small too."""
    cfg = GradInForwardConfig(block_t=block_t, logits=logits, backward=LinearCrossEntropyConfig(block_t=4, block_v=16))
    return ImplChoice(platform="xla", backend="any", implementation="grad_in_forward", cfg=cfg)


GRAD_IN_FORWARD_OPTIONS = [  # every one served by the gradients saved in the forward pass
    {},
    {"reduction": "sum"},
    {"label_smoothing": 0.1},
    {"reduction": "sum", "label_smoothing": 0.2, "ignore_index": 3},  # an in-vocabulary ignore_index
    {"logit_soft_cap": 4.0},
    {"logit_soft_cap": 4.0, "label_smoothing": 0.3},  # smoothing folded under the cap
    {"z_loss": 1e-2},  # z-loss folded into the log-sum-exp's cotangent
    {"reduction": "sum", "z_loss": 1e-2, "label_smoothing": 0.1},
    {"z_loss": 1e-2, "logit_soft_cap": 4.0, "label_smoothing": 0.2, "ignore_index": 3},
]


@pytest.mark.parametrize("options", GRAD_IN_FORWARD_OPTIONS,
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_grad_in_forward_matches_a_float64_oracle(options: dict[str, Any]) -> None:
    rng = np.random.default_rng(0)
    t, h, v = 11, 8, 37  # 4-token chunks: the last one overlaps the one before
    x = rng.standard_normal((t, h)).astype(np.float32)
    w = rng.standard_normal((h, v)).astype(np.float32)
    labels = rng.integers(0, v, t).astype(np.int32)
    labels[::4] = options.get("ignore_index", -100)

    def loss(x: jax.Array, w: jax.Array) -> jax.Array:
        out = ejk.linear_cross_entropy(x, w, jnp.asarray(labels), cfg=_gif_choice(), **options)
        return out.sum() if out.ndim else out

    value, (dx, dw) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)
    want, want_dx, want_dw = _float64_loss_and_grads(x, w, labels, **options)
    assert (dx.dtype, dw.dtype) == (jnp.float32, jnp.float32)
    for got, ref in ((value, np.sum(want)), (dx, want_dx), (dw, want_dw)):
        np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_grad_in_forward_a_scaled_loss_and_ignored_tokens_everywhere_or_nowhere(scale: float) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 8)).astype(np.float32)
    w = rng.standard_normal((8, 20)).astype(np.float32)
    for labels in (rng.integers(0, 20, 9).astype(np.int32), np.full((9,), -100, np.int32)):
        value, (dx, dw) = jax.value_and_grad(
            lambda x, w, labels=labels: scale * ejk.linear_cross_entropy(x, w, jnp.asarray(labels), cfg=_gif_choice()),
            argnums=(0, 1))(x, w)
        want, want_dx, want_dw = _float64_loss_and_grads(x, w, labels)
        for got, ref in ((value, want), (dx, want_dx), (dw, want_dw)):
            np.testing.assert_allclose(np.asarray(got, np.float64), scale * np.asarray(ref), rtol=2e-5, atol=2e-5)
        if (labels < 0).all():
            assert float(value) == 0.0 and not np.any(dx) and not np.any(dw)


@pytest.mark.parametrize("logits", ["float32", "input"])
def test_grad_in_forward_bfloat16(logits: str) -> None:
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((10, 16)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((16, 40)) / 4, jnp.bfloat16)
    labels = rng.integers(0, 40, 10).astype(np.int32)
    labels[3] = -100
    value, (dx, dw) = jax.value_and_grad(
        lambda x, w: ejk.linear_cross_entropy(x, w, jnp.asarray(labels), label_smoothing=0.1, z_loss=1e-2,
                                              cfg=_gif_choice(logits=logits)), argnums=(0, 1))(x, w)
    assert (dx.dtype, dw.dtype) == (jnp.bfloat16, jnp.bfloat16)
    want, want_dx, want_dw = _float64_loss_and_grads(np.asarray(x, np.float32), np.asarray(w, np.float32), labels,
                                                     label_smoothing=0.1, z_loss=1e-2)
    assert_close(value, want, jnp.bfloat16, what="loss")
    assert_close(dx, want_dx, jnp.bfloat16, what="dx")
    assert_close(dw, want_dw, jnp.bfloat16, what="dw")


def _cotangents(labels: jax.Array, lse: jax.Array, vocab: int, scale: float = 1.0,
                **options: Any) -> tuple[jax.Array, ...]:
    """The statistics' cotangents the op layer produces for a cotangent ``scale`` on its loss
    (docs/KERNEL_CONTRACT.md): per counted token ``c·(1 + 2·z_loss·lse)``, ``−(1 − ε)·c``, ``−(ε / V)·c``."""
    valid = (labels >= 0) & (labels < vocab)
    weight = scale * valid / (jnp.sum(valid) if options.get("reduction", "mean") == "mean" else 1.0)
    smoothing = options.get("label_smoothing", 0.0)
    return (weight * (1 + 2 * options.get("z_loss", 0.0) * lse), -(1 - smoothing) * weight,
            -(smoothing / vocab) * weight)


def _poisoned(*args: Any, **kwargs: Any) -> tuple[jax.Array, jax.Array]:
    """A stand-in for the chunked backward: NaN gradients show where it ran."""
    x, w = args[:2]
    return jnp.full(x.shape, jnp.nan, x.dtype), jnp.full(w.shape, jnp.nan, w.dtype)


BACKWARD_CASES = [  # (options, logit_soft_cap, the cotangents differ from the op layer's: a per-token d_lse)
    ({}, None, False), ({"reduction": "sum", "label_smoothing": 0.1}, None, False), ({}, 3.0, False),
    ({"label_smoothing": 0.1}, 3.0, False), ({"z_loss": 1e-3}, None, False),
    ({"reduction": "sum", "z_loss": 1e-2, "label_smoothing": 0.2}, 3.0, False),
    ({}, None, True), ({"z_loss": 1e-3}, 3.0, True),
]


@pytest.mark.parametrize(("options", "cap", "per_token"), BACKWARD_CASES)
def test_grad_in_forward_which_backward_serves_the_op_layers_cotangents(
        monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], cap: float | None, per_token: bool) -> None:
    """The op layer's cotangents (any scale) are served by the saved gradients, never by the recomputing
    backward (poisoned here); a per-token cotangent takes it."""
    rng = np.random.default_rng(4)
    x, w = jnp.asarray(rng.standard_normal((7, 4)), jnp.float32), jnp.asarray(rng.standard_normal((4, 10)), jnp.float32)
    labels = jnp.asarray([4, -1, 0, 7, 2, -1, 9], jnp.int32)
    static = {"logit_soft_cap": cap, "precision": "highest", "cfg": _gif_choice().cfg, **options}
    stats, residuals = gif.linear_cross_entropy_fwd(x, w, labels, **static)
    cotangents = list(_cotangents(labels, stats[0], 10, scale=2.5, **options))
    if per_token:
        cotangents[0] = cotangents[0] * jnp.linspace(0.5, 1.5, 7)
    monkeypatch.setattr(gif.chunked, "_gradients", _poisoned)
    dx, dw, _ = gif.linear_cross_entropy_bwd(residuals, tuple(cotangents), **static)
    assert bool(jnp.isnan(dx).any()) is per_token and bool(jnp.isnan(dw).any()) is per_token
    monkeypatch.undo()
    got = gif.linear_cross_entropy_bwd(residuals, tuple(cotangents), **static)[:2] if per_token else (dx, dw)
    _, chunked_residuals = gif.chunked.linear_cross_entropy_fwd(x, w, labels, logit_soft_cap=cap)
    want = gif.chunked.linear_cross_entropy_bwd(chunked_residuals, tuple(cotangents), logit_soft_cap=cap)[:2]
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_grad_in_forward_z_loss_never_recomputes_the_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: z-loss (with smoothing, a soft cap, ignored tokens) takes the saved gradients; with the
    run-time check made to fail, the (poisoned) recomputing backward shows."""
    rng = np.random.default_rng(5)
    t, h, v = 13, 4, 23  # shapes of this test alone: nothing traced before with the real backward
    x, w = rng.standard_normal((t, h)).astype(np.float32), rng.standard_normal((h, v)).astype(np.float32)
    labels = rng.integers(0, v, t).astype(np.int32)
    labels[::5] = 3
    options = {"z_loss": 1e-2, "label_smoothing": 0.1, "logit_soft_cap": 5.0, "ignore_index": 3}
    monkeypatch.setattr(gif.chunked, "_gradients", _poisoned)

    def grads(reduction: str) -> tuple[jax.Array, ...]:
        return jax.jit(jax.grad(lambda x, w: ejk.linear_cross_entropy(
            x, w, jnp.asarray(labels), reduction=reduction, cfg=_gif_choice(), **options), argnums=(0, 1)))(x, w)

    _, want_dx, want_dw = _float64_loss_and_grads(x, w, labels, reduction="sum", **options)
    dx, dw = grads("sum")
    np.testing.assert_allclose(np.asarray(dx, np.float64), want_dx, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(dw, np.float64), want_dw, rtol=2e-5, atol=2e-5)
    monkeypatch.setattr(gif, "PROPORTIONAL_TOLERANCE", -1.0)  # no cotangent passes the check
    assert all(bool(jnp.isnan(g).all()) for g in grads("mean"))


def test_grad_in_forward_refuses_reduction_none_naming_chunked() -> None:
    x, w, labels = jnp.ones((4, 3)), jnp.ones((3, 5)), jnp.zeros((4,), jnp.int32)
    reason = gif.capability(x=x, w=w, labels=labels, reduction="none")
    assert reason is not None and "xla/any:chunked" in reason
    assert gif.capability(x=x, w=w, labels=labels, reduction="sum") is None
    with pytest.raises(ValueError, match=r"grad_in_forward: reduction='none' .*xla/any:chunked"):
        ejk.linear_cross_entropy(x, w, labels, reduction="none", cfg=_gif_choice())
    explained = ejk.explain("linear_cross_entropy", x, w, labels, reduction="none")
    (report,) = [r for r in explained.implementations if r.label == "xla/any:grad_in_forward"]
    assert report.status != "chosen" and "xla/any:chunked" in str(report.reason)


class _H100:
    """What JAX's device object says of an H100, for the device fingerprint the rankings match."""

    platform = "gpu"
    device_kind = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(("options", "chosen"), [
    ({}, "xla/any:grad_in_forward"), ({"reduction": "sum", "z_loss": 1e-4}, "xla/any:grad_in_forward"),
    ({"z_loss": 1e-4, "label_smoothing": 0.1, "logit_soft_cap": 30.0}, "xla/any:grad_in_forward"),
    ({"reduction": "none"}, "xla/any:chunked"), ({"reduction": "none", "z_loss": 1e-4}, "xla/any:chunked"),
])
def test_the_h100_ranking_sends_reduction_none_to_chunked(options: dict[str, Any], chosen: str) -> None:
    """The shipped H100 pack ranks grad_in_forward first for bfloat16; its gate sends per-token losses on."""
    executor = ejk.Executor(ejk.ConfigSelectorChain(policy=ejk.AutotunePolicy(autotune=False), persist=False),
                            device=_H100())
    assert executor.device_fingerprint() == "gpu|NVIDIA_H100_80GB_HBM3"
    args = (jax.ShapeDtypeStruct((4096, 256), jnp.bfloat16), jax.ShapeDtypeStruct((256, 32000), jnp.bfloat16),
            jax.ShapeDtypeStruct((4096,), jnp.int32))
    found = ejk.explain("linear_cross_entropy", *args, executor=executor, **options)
    assert get_op("linear_cross_entropy").kernel.cfg_label(found.chosen) == chosen, found
    assert found.ranking is not None and "nvidia_h100" in found.ranking


def test_grad_in_forward_conformance() -> None:
    from ejk.testing import LINEAR_CROSS_ENTROPY_CASES as CASES

    cases = [case for case in CASES if case[4].get("reduction") != "none"]  # refused (see below)
    assert check_linear_cross_entropy("xla", dtypes=(jnp.float32,), cfg=_gif_choice(), cases=cases[:4]) == 4


def test_grad_in_forward_no_tokens_and_an_undifferentiated_call() -> None:
    x, w = jnp.zeros((0, 8)), jnp.ones((8, 5))
    labels = jnp.zeros((0,), jnp.int32)
    dx, dw = jax.grad(lambda x, w: ejk.linear_cross_entropy(x, w, labels, cfg=_gif_choice()), argnums=(0, 1))(x, w)
    assert dx.shape == (0, 8) and not np.any(dw)
    x = jnp.ones((3, 8))
    got = ejk.linear_cross_entropy(x, w, jnp.asarray([0, 1, 4], jnp.int32), cfg=_gif_choice())
    np.testing.assert_allclose(got, np.log(5.0), rtol=1e-6)


def test_grad_in_forward_temporary_memory() -> None:
    choice = _gif_choice(block_t=64)

    def fused(x: jax.Array, w: jax.Array, labels: jax.Array) -> jax.Array:
        return ejk.linear_cross_entropy(x, w, labels, cfg=choice)

    h = 32
    small = _temp_bytes(fused, 512, h, 4096)
    large = _temp_bytes(fused, 2048, h, 16384)  # 16x the logits
    unfused = _temp_bytes(reference, 2048, h, 16384)
    assert large <= 0.05 * unfused, (large, unfused)
    # What grows: one chunk's logits and cotangent (64·V each), the saved dx and dw, never T·V.
    assert large - small <= 4 * (3 * 64 * (16384 - 4096) + 3 * (2048 - 512) * h + 3 * h * (16384 - 4096)), \
        (small, large)


def test_grad_in_forward_config_validation_heuristic_and_space() -> None:
    with pytest.raises(ValueError, match="logits is 'half' but needs 'float32' or 'input'"):
        GradInForwardConfig(logits="half")
    x = jax.ShapeDtypeStruct((16384, 4096), jnp.bfloat16)
    assert len(gif.config_space(x, jax.ShapeDtypeStruct((4096, 131072), jnp.bfloat16))) == 6
    assert len(gif.config_space(jax.ShapeDtypeStruct((100, 8), jnp.float32), x)) == 2
    assert gif.heuristic_config(x, jax.ShapeDtypeStruct((4096, 131072), jnp.bfloat16)).block_t == 256  # a CPU


def test_grad_in_forward_gpu_heuristic_keeps_a_chunk_within_its_share_of_the_unfused_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gif.jax, "default_backend", lambda: "gpu")
    w = jax.ShapeDtypeStruct((4096, 131072), jnp.bfloat16)
    for t, dtype, block_t in ((16384, jnp.bfloat16, 1024), (16384, jnp.float32, 512), (65536, jnp.bfloat16, 2048),
                              (1000, jnp.bfloat16, 256)):
        cfg = gif.heuristic_config(jax.ShapeDtypeStruct((t, 4096), dtype), w)
        assert (cfg.block_t, cfg.logits) == (block_t, "input"), (t, dtype, cfg)
