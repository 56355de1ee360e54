"""External baselines: what a user would call instead of ejk, measured in the same process.

A baseline is a small registry entry (:func:`register_baseline`): which op it stands in for,
why it cannot run a case here (``None``: it can), and how to build its function and arguments
from the case's inputs (conversions such as a page-layout transpose happen there, untimed).
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Callable
from typing import Any, Literal

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk.bench._cases import AttentionCase, MlaCase, MoeCase, PagedCase
from ejk.bench._torch import BACKENDS, torch_sdpa, torch_sdpa_unsupported
from ejk.bench._workloads import Workload

__all__ = ["BASELINES", "Baseline", "Prepared", "baselines_for", "register_baseline"]


@attrs.frozen(kw_only=True)
class Prepared:
    """A baseline ready to time: ``fn(*args)``, differentiable in the arguments at ``diff``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    diff: tuple[int, ...] = ()
    #: A line timed outside JAX (PyTorch): ``external(mode, cotangent)`` returns a callable that launches one
    #: call and returns a handle with ``block_until_ready()`` (and optionally ``to_jax()`` for the output
    #: check and ``close()``, called once the line is timed); ``fn`` is then not used.
    external: Callable[[str, Any], Any] | None = None


@attrs.frozen(kw_only=True)
class Baseline:
    """One external baseline.

    Attributes:
        name: Its line in the report, e.g. ``"jax.nn cudnn"``.
        op: The ejk op it stands in for.
        build: ``build(workload, inputs) -> Prepared`` from the op's inputs.
        unsupported: ``unsupported(workload) -> str | None``: why it cannot run the case here.
        comparable: ``comparable(workload) -> bool``: whether it computes the same thing, so that
            it counts for the "ratio to the best baseline" (an upper bound that does not is shown
            but not compared against).
        note: What it is, for the report.
    """

    name: str
    op: str
    build: Callable[[Workload, tuple[Any, ...]], Prepared] = attrs.field(eq=False)
    unsupported: Callable[[Workload], str | None] = attrs.field(default=lambda w: None, eq=False)
    comparable: Callable[[Workload], bool] = attrs.field(default=lambda w: True, eq=False)
    note: str = ""


#: Every registered baseline, in registration order.
BASELINES: list[Baseline] = []


def register_baseline(baseline: Baseline) -> Baseline:
    """Add ``baseline`` (replacing one of the same name and op)."""
    BASELINES[:] = [b for b in BASELINES if (b.name, b.op) != (baseline.name, baseline.op)]
    BASELINES.append(baseline)
    return baseline


def baselines_for(op: str) -> list[Baseline]:
    """The baselines of ``op``."""
    return [b for b in BASELINES if b.op == op]


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def _needs_gpu(what: str) -> Callable[[Workload], str | None]:
    def unsupported(workload: Workload) -> str | None:
        return None if _on_gpu() else f"{what} needs an NVIDIA GPU"

    return unsupported


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# -- flash_attention --------------------------------------------------------------------------------


def _jax_nn(implementation: Literal["xla", "cudnn"]) -> Callable[[Workload, tuple[Any, ...]], Prepared]:
    def build(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
        causal = bool(getattr(workload.case, "causal", False))
        window = getattr(workload.case, "window", None)
        local = None if window is None else (int(window), 0)  # causal, as ejk's cases with a window
        d, dv = inputs[0].shape[-1], inputs[2].shape[-1]
        width = max(d, dv)  # jax.nn needs one head dim: zeros pad the narrower (q, k or v), as users do

        def pad(x: jax.Array) -> jax.Array:
            return jnp.pad(x, [(0, 0)] * 3 + [(0, width - x.shape[-1])]) if x.shape[-1] < width else x

        def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            out = jax.nn.dot_product_attention(pad(q), pad(k), pad(v), scale=d ** -0.5, is_causal=causal,
                                               local_window_size=local, implementation=implementation)
            return out[..., :dv]

        # jax.nn has no attention sinks: a case with them runs without (see _without_sinks)
        return Prepared(fn=fn, args=inputs[:3], diff=(0, 1, 2))

    return build


def _jax_reference_kernel(module: str) -> Any:
    """One of jax's own Pallas example kernels, a baseline: jax deprecates some of them (e.g. the GPU paged
    attention in 0.11), which says nothing about the comparison, so their import's DeprecationWarning is
    not raised as an error where warnings are errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(module)


def _pallas_mha(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
    attention = _jax_reference_kernel("jax.experimental.pallas.ops.gpu.attention")

    case = workload.case
    assert isinstance(case, AttentionCase)

    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return attention.mha(q, k, v, None, sm_scale=case.dim ** -0.5, causal=case.causal)  # type: ignore[no-any-return]

    return Prepared(fn=fn, args=inputs, diff=(0, 1, 2))


def _without_sinks(workload: Workload) -> bool:
    """Whether a baseline computes the case: jax's attention has no sinks (shown, not compared, with them)."""
    return not getattr(workload.case, "sinks", False)


def _pallas_mha_unsupported(workload: Workload) -> str | None:
    if not _on_gpu():
        return "jax's Pallas GPU attention needs an NVIDIA GPU"
    if not _has_module("jax.experimental.pallas.ops.gpu.attention"):
        return f"jax {jax.__version__} ships no jax.experimental.pallas.ops.gpu.attention"
    case = workload.case
    if isinstance(case, AttentionCase) and case.kv_heads != case.heads:
        return "jax's Pallas mha needs as many kv heads as q heads (no GQA)"
    if isinstance(case, AttentionCase) and case.v_dim != case.dim:
        return "jax's Pallas mha needs one head dim for q, k and v"
    if isinstance(case, AttentionCase) and (case.window is not None or case.sinks):
        return "jax's Pallas mha has no sliding window and no sinks"
    return None


# -- flash_attention_varlen --------------------------------------------------------------------------


def _varlen_segments(workload: Workload, inputs: tuple[Any, ...], platform: str = "auto") -> Prepared:
    """``ejk.flash_attention`` on ``[1, T]`` with one segment id per sequence: the same attention (the
    presets' sequences have equal query and key lengths, so global causal masks are per-sequence ones)."""
    from ejk.ops import flash_attention

    q, k, v, *_ = inputs
    lens = workload.case.lens  # type: ignore[attr-defined]
    ids = jnp.asarray(np.repeat(np.arange(len(lens), dtype=np.int32), lens))[None]
    causal = bool(workload.case.causal)  # type: ignore[attr-defined]

    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        out = flash_attention(q[None], k[None], v[None], causal=causal, q_segment_ids=ids, kv_segment_ids=ids,
                              platform=platform)
        return out[0]

    return Prepared(fn=fn, args=(q, k, v), diff=(0, 1, 2))


def _varlen_batched(workload: Workload, inputs: tuple[Any, ...], platform: str = "auto") -> Prepared:
    """``ejk.flash_attention`` on ``[N, L]``: dense batched attention of exactly the same work (equal lengths)."""
    from ejk.ops import flash_attention

    q, k, v, *_ = inputs
    lens = workload.case.lens  # type: ignore[attr-defined]
    causal = bool(workload.case.causal)  # type: ignore[attr-defined]
    n, length = len(lens), lens[0]

    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        batched = (x.reshape(n, length, *x.shape[1:]) for x in (q, k, v))
        out = flash_attention(*batched, causal=causal, platform=platform)
        return out.reshape(q.shape[0], q.shape[1], v.shape[2])

    return Prepared(fn=fn, args=(q, k, v), diff=(0, 1, 2))


def _dense_triton_unsupported(workload: Workload) -> str | None:
    from ejk.registry import kernel_registry

    available, reason = kernel_registry.platform_available("triton")
    return _equal_lengths_unsupported(workload) or (None if available else f"platform triton: {reason}")


def _segments_triton_unsupported(workload: Workload) -> str | None:
    from ejk.registry import kernel_registry

    if not _on_gpu():
        return "ejk-triton's segments kernel needs an NVIDIA GPU"
    available, reason = kernel_registry.platform_available("triton")
    return None if available else f"platform triton: {reason}"


def _equal_lengths_unsupported(workload: Workload) -> str | None:
    lens = workload.case.lens  # type: ignore[attr-defined]
    return None if len(set(lens)) == 1 else "needs sequences of one length (a dense [N, L] batch)"
def _torch_line(backend: str) -> Callable[[Workload, tuple[Any, ...]], Prepared]:
    def build(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
        def not_jax(*_: Any) -> Any:
            raise RuntimeError("a torch baseline runs outside JAX")

        make = torch_sdpa(backend)
        return Prepared(fn=not_jax, args=inputs, diff=(0, 1, 2),
                        external=lambda mode, cotangent: make(workload, inputs, mode, cotangent))

    return build


# -- ragged_paged_attention --------------------------------------------------------------------------


def _dense_paged(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
    """Gather each sequence's pages into ``[S, ctx, Hkv, D]``, repeat kv heads, ``jax.nn`` (xla).

    The gather is inside the timed call (it is what the dense path costs).
    """
    case = workload.case
    assert isinstance(case, PagedCase)
    groups = case.hq // case.hkv
    q_pos = case.ctx - case.q_len + jnp.arange(case.q_len)
    mask = (jnp.arange(case.ctx)[None, :] <= q_pos[:, None])[None, None]  # bottom-right causal

    def fn(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_indices: jax.Array) -> jax.Array:
        dims = (case.seqs, -1, case.hkv, case.dim)
        k = jnp.repeat(k_pages[page_indices].reshape(dims)[:, : case.ctx], groups, axis=2)
        v = jnp.repeat(v_pages[page_indices].reshape(dims)[:, : case.ctx], groups, axis=2)
        out = jax.nn.dot_product_attention(q.reshape(case.seqs, case.q_len, case.hq, case.dim), k, v,
                                           mask=mask, scale=case.dim ** -0.5, implementation="xla")
        return out.reshape(q.shape)

    q, k_pages, v_pages, _, page_indices, *_ = inputs
    return Prepared(fn=fn, args=(q, k_pages, v_pages, page_indices))


def _pallas_paged(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
    paged_attention = _jax_reference_kernel("jax.experimental.pallas.ops.gpu.paged_attention")

    case = workload.case
    assert isinstance(case, PagedCase)
    q, k_pages, v_pages, kv_lens, page_indices, *_ = inputs
    pages_per_seq = page_indices.shape[1]
    k_splits = max(d for d in (16, 8, 4, 2, 1) if pages_per_seq % d == 0)
    # Its layout is [Hkv, pages, page, D] and it does not scale the logits: both done here, untimed.
    k_heads_first = jnp.transpose(k_pages, (2, 0, 1, 3))
    v_heads_first = jnp.transpose(v_pages, (2, 0, 1, 3))
    q_scaled = (q.astype(jnp.float32) * case.dim ** -0.5).astype(q.dtype)

    def fn(q: jax.Array, k: jax.Array, v: jax.Array, table: jax.Array, lengths: jax.Array) -> jax.Array:
        return paged_attention.paged_attention(q, k, v, table, lengths, k_splits=k_splits)  # type: ignore[no-any-return]

    return Prepared(fn=fn, args=(q_scaled, k_heads_first, v_heads_first, page_indices, kv_lens))


def _pallas_paged_unsupported(workload: Workload) -> str | None:
    if not _on_gpu():
        return "jax's Pallas GPU paged attention needs an NVIDIA GPU"
    if not _has_module("jax.experimental.pallas.ops.gpu.paged_attention"):
        return f"jax {jax.__version__} ships no jax.experimental.pallas.ops.gpu.paged_attention"
    case = workload.case
    if isinstance(case, PagedCase) and not case.decode:
        return "jax's Pallas paged attention is decode only (one query per sequence)"
    return None


# -- mla_paged_attention -----------------------------------------------------------------------------


def _dense_mla(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
    """Gather each sequence's latents into ``[B, ctx, Dk]``, then plain ``einsum`` attention (xla):
    float32 logits and softmax, the latents' first ``Dv`` dims as values. The gather is timed."""
    case = workload.case
    assert isinstance(case, MlaCase)
    q_pos = case.ctx - case.sq + jnp.arange(case.sq)
    mask = (jnp.arange(case.ctx)[None, :] <= q_pos[:, None])[None, :, None, :]  # [1, Sq, 1, ctx], causal

    def fn(q: jax.Array, kv_pages: jax.Array, page_indices: jax.Array) -> jax.Array:
        latent = kv_pages[page_indices].reshape(case.batch, -1, case.dk)[:, : case.ctx]
        logits = jnp.einsum("bshd,bkd->bshk", q, latent, preferred_element_type=jnp.float32) * case.dk ** -0.5
        probs = jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), axis=-1)
        out = jnp.einsum("bshk,bkd->bshd", probs.astype(q.dtype), latent[..., : case.dv],
                         preferred_element_type=jnp.float32)
        return out.astype(q.dtype)

    q, kv_pages, _, page_indices = inputs
    return Prepared(fn=fn, args=(q, kv_pages, page_indices))


# -- grouped_matmul ----------------------------------------------------------------------------------


def _gated(workload: Workload, out: jax.Array) -> jax.Array:
    """A baseline's product gated as the case asks (``activation``), in XLA after the product."""
    from ejk.ops import gated_output

    activation = getattr(workload.case, "activation", None)
    if activation is None:
        return out
    return gated_output(out.astype(jnp.float32), activation).astype(out.dtype)


def _ragged_dot(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
    def fn(lhs: jax.Array, rhs: jax.Array, sizes: jax.Array) -> jax.Array:
        return _gated(workload, jax.lax.ragged_dot(lhs, rhs, sizes, precision=jax.lax.Precision.DEFAULT))

    return Prepared(fn=fn, args=inputs, diff=(0, 1))


def _dense_equal_groups(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
    """``einsum`` over ``[g, m/g, k] x [g, k, n]``: equal groups, the same FLOPs."""
    lhs, rhs, _ = inputs
    g = rhs.shape[0]

    def fn(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
        out = jnp.einsum("gtk,gkn->gtn", lhs.reshape(g, lhs.shape[0] // g, lhs.shape[1]), rhs,
                         precision=jax.lax.Precision.DEFAULT)
        return _gated(workload, out.reshape(lhs.shape[0], rhs.shape[2]))

    return Prepared(fn=fn, args=(lhs, rhs), diff=(0, 1))


def _unfused_gate(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
    """ejk's plain grouped matmul (``platform="auto"``), then the activation in XLA: what fusing it saves."""
    import ejk

    def fn(lhs: jax.Array, rhs: jax.Array, sizes: jax.Array) -> jax.Array:
        return _gated(workload, ejk.grouped_matmul(lhs, rhs, sizes, precision="default"))

    return Prepared(fn=fn, args=inputs, diff=(0, 1))


def _ungated_unsupported(workload: Workload) -> str | None:
    return None if getattr(workload.case, "activation", None) else "the case has no activation"


def _equal_groups_unsupported(workload: Workload) -> str | None:
    case = workload.case
    if isinstance(case, MoeCase) and case.tokens % case.experts:
        return f"m={case.tokens} is not a multiple of g={case.experts}"
    return None


def _equal_groups_comparable(workload: Workload) -> bool:
    case = workload.case
    return isinstance(case, MoeCase) and not case.skewed


# -- matmul -----------------------------------------------------------------------------------------


def _matmul(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
    def fn(a: jax.Array, b: jax.Array) -> jax.Array:
        return a @ b

    return Prepared(fn=fn, args=inputs, diff=(0, 1))


# -- linear_cross_entropy ---------------------------------------------------------------------------


def _unfused_cross_entropy(with_optax: bool) -> Callable[[Workload, tuple[Any, ...]], Prepared]:
    """``x @ w`` materialised (the matmul's dtype, cast to float32 as training code does), then the loss,
    with the case's label smoothing and z-loss (``z · lse²``) when it has them."""

    def build(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
        x, w, labels = inputs
        options = workload.kwargs()
        smoothing, z_loss = float(options.get("label_smoothing", 0.0)), float(options.get("z_loss", 0.0))

        def fn(x: jax.Array, w: jax.Array) -> jax.Array:
            logits = (x @ w).astype(jnp.float32)
            lse = jax.nn.logsumexp(logits, axis=1)
            if with_optax:
                optax = importlib.import_module("optax")
                per_token = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
                if smoothing:
                    per_token = (1.0 - smoothing) * per_token + smoothing * (lse - jnp.mean(logits, axis=1))
            else:
                picked = jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0]
                per_token = lse - (1.0 - smoothing) * picked
                if smoothing:
                    per_token = per_token - smoothing * jnp.mean(logits, axis=1)
            if z_loss:
                per_token = per_token + z_loss * jnp.square(lse)
            return jnp.mean(per_token)

        return Prepared(fn=fn, args=(x, w), diff=(0, 1))

    return build


def _optax_unsupported(workload: Workload) -> str | None:
    return None if _has_module("optax") else "optax is not installed (pip install optax)"


# -- rms_norm ---------------------------------------------------------------------------------------


def _rms_norm_expression(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
    def norm(x: jax.Array, scale: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + 1e-6)
        return (normed * scale.astype(jnp.float32)).astype(x.dtype)

    def with_residual(x: jax.Array, scale: jax.Array, residual: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = x + residual
        return norm(h, scale), h

    fn = with_residual if len(inputs) == 3 else norm
    return Prepared(fn=fn, args=inputs, diff=tuple(range(len(inputs))))


def _scale_only(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
    """``x * scale`` (and ``h = x + residual``): RMSNorm's bytes without its row statistics.

    Its backward reads what RMSNorm's reads (``x`` saved by the forward, and ``dy``) and writes ``dx`` (and
    ``dscale``), from behind an optimization barrier: XLA must not fuse it with the forward and read ``x``
    once for both, which a training step, whose backward runs long after, cannot do either."""

    @jax.custom_vjp
    def scaled(x: jax.Array, scale: jax.Array) -> jax.Array:
        return x * scale.astype(x.dtype)

    def forward(x: jax.Array, scale: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        return scaled(x, scale), jax.lax.optimization_barrier((x, scale))

    def backward(saved: tuple[jax.Array, jax.Array], dy: jax.Array) -> tuple[jax.Array, jax.Array]:
        x, scale = saved
        dx = dy * scale.astype(dy.dtype)
        dscale = jnp.sum((dy.astype(jnp.float32) * x.astype(jnp.float32)).reshape(-1, x.shape[-1]), axis=0)
        return dx, dscale.astype(scale.dtype)

    scaled.defvjp(forward, backward)

    def with_residual(x: jax.Array, scale: jax.Array, residual: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = x + residual
        return scaled(h, scale), h

    fn = with_residual if len(inputs) == 3 else scaled
    return Prepared(fn=fn, args=inputs, diff=tuple(range(len(inputs))))


def _never_comparable(workload: Workload) -> bool:
    return False


for _baseline in (
    Baseline(name="jax.nn cudnn", op="flash_attention", build=_jax_nn("cudnn"),
             unsupported=_needs_gpu("jax.nn.dot_product_attention(implementation='cudnn')"),
             comparable=_without_sinks,
             note="jax.nn.dot_product_attention(implementation='cudnn'); no sinks (a case with them runs without)"),
    Baseline(name="jax.nn xla", op="flash_attention", build=_jax_nn("xla"), comparable=_without_sinks,
             note="jax.nn.dot_product_attention(implementation='xla'): materialised logits; no sinks"),
    Baseline(name="jax pallas mha", op="flash_attention", build=_pallas_mha, unsupported=_pallas_mha_unsupported,
             note="jax.experimental.pallas.ops.gpu.attention.mha, default blocks"),
    Baseline(name="ejk flash_attention segment ids", op="flash_attention_varlen", build=_varlen_segments,
             note="ejk.flash_attention on [1, T] with one segment id per sequence (platform auto)"),
    Baseline(name="ejk flash_attention segment ids triton", op="flash_attention_varlen",
             build=lambda workload, inputs: _varlen_segments(workload, inputs, "triton"),
             unsupported=_segments_triton_unsupported,
             note="the same segment-id call forced to ejk-triton (triton/gpu:segments), against cuDNN's packed "
                  "segments that platform auto takes on an H100"),
    Baseline(name="ejk flash_attention [N, L]", op="flash_attention_varlen", build=_varlen_batched,
             unsupported=_equal_lengths_unsupported,
             note="ejk.flash_attention on the dense [N, L] batch of the same sequences (equal lengths only): "
                  "the same work, the issue's 5% target"),
    Baseline(name="ejk flash_attention [N, L] triton", op="flash_attention_varlen",
             build=lambda workload, inputs: _varlen_batched(workload, inputs, "triton"),
             unsupported=_dense_triton_unsupported,
             note="ejk.flash_attention(platform='triton') on the same dense [N, L] batch: ejk-triton's flash kernel, "
                  "the model of its varlen kernels"),
    *(Baseline(name=name, op="flash_attention", build=_torch_line(backend), unsupported=torch_sdpa_unsupported(backend),
               note=f"torch.nn.functional.scaled_dot_product_attention, SDPBackend.{backend}, [B, H, S, D]")
      for name, backend in BACKENDS.items()),
    Baseline(name="jax pallas paged", op="ragged_paged_attention", build=_pallas_paged,
             unsupported=_pallas_paged_unsupported,
             note="jax.experimental.pallas.ops.gpu.paged_attention (decode), default blocks"),
    Baseline(name="dense gather + jax.nn xla", op="ragged_paged_attention", build=_dense_paged,
             note="gather the pages, repeat kv heads, jax.nn.dot_product_attention(implementation='xla')"),
    Baseline(name="dense gather + einsum xla", op="mla_paged_attention", build=_dense_mla,
             note="gather the latents, einsum attention with float32 logits (xla)"),
    Baseline(name="lax.ragged_dot", op="grouped_matmul", build=_ragged_dot,
             note="jax.lax.ragged_dot (then the case's activation in XLA)"),
    Baseline(name="ejk plain + activation", op="grouped_matmul", build=_unfused_gate,
             unsupported=_ungated_unsupported,
             note="ejk.grouped_matmul without the activation (auto), then the activation in XLA"),
    Baseline(name="dense einsum (equal groups)", op="grouped_matmul", build=_dense_equal_groups,
             unsupported=_equal_groups_unsupported, comparable=_equal_groups_comparable,
             note="einsum over [g, m/g, k] x [g, k, n]: the same FLOPs over equal groups "
                  "(an upper bound for skewed groups, not compared against)"),
    Baseline(name="a @ b", op="matmul", build=_matmul, note="jnp.matmul at default precision"),
    Baseline(name="x @ w + optax", op="linear_cross_entropy", build=_unfused_cross_entropy(True),
             unsupported=_optax_unsupported,
             note="logits = x @ w materialised, optax.softmax_cross_entropy_with_integer_labels(float32 logits) "
                  "(+ smoothing and z-loss terms in jnp when the case has them)"),
    Baseline(name="x @ w + jnp log-softmax", op="linear_cross_entropy", build=_unfused_cross_entropy(False),
             note="logits = x @ w materialised, float32 logsumexp minus the label's logit (XLA fuses the loss)"),
    Baseline(name="XLA-fused expression", op="rms_norm", build=_rms_norm_expression,
             note="x * rsqrt(mean(x²) + eps) * scale in float32 with jnp (h = x + residual first, returned too), "
                  "differentiated by JAX"),
    Baseline(name="XLA x * scale (bandwidth ceiling)", op="rms_norm", build=_scale_only, comparable=_never_comparable,
             note="x * scale (h = x + residual first) with jnp: the same arrays read and written as RMSNorm, "
                  "forward and backward, without the row statistics; what the memory system gives this traffic "
                  "(not the same result: no ratio)"),
):
    register_baseline(_baseline)
