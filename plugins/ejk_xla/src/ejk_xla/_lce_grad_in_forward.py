"""XLA ``linear_cross_entropy`` that computes the gradients in the forward pass (three products, not four).

The chunked implementation (``_linear_cross_entropy``) computes the logits twice when a call is
differentiated: once for the statistics, once in the backward pass for their cotangent. This one,
when differentiated, walks chunks of ``block_t`` tokens once: a chunk's ``[block_t, V]`` logits
``x_c @ w`` give its statistics, then at once its logits' cotangent for the loss's usual cotangent
and the two gradient products ``dx_c = dz_c @ wᵀ`` and ``dw += x_cᵀ @ dz_c``. Three products of
``2·T·H·V`` flops, as the unfused ``x @ w`` + softmax cross-entropy does. Called without
differentiation it runs the chunked implementation's forward pass (one product).

Which cotangent the forward pass assumes: the op layer builds the loss from the statistics
``(lse, z_label, z_sum)`` and passes the loss options (``reduction``, ``label_smoothing`` ``ε``,
``z_loss`` ``ζ``) to this implementation. With ``reduction="mean"`` or ``"sum"`` their cotangents are
``d_lse = s·α·(1 + 2ζ·lse)``, ``d_z_label = −(1 − ε)·s·α``, ``d_z_sum = −(ε / V)·s·α`` for one scalar
``s`` (the loss's cotangent), where ``α`` is 1 (``"sum"``) or 1 over the number of tokens whose
label is in ``[0, V)`` (``"mean"``) for those tokens and 0 for the others (the op layer passes the
tokens it ignores as out-of-vocabulary labels). The forward pass saves ``dx₀, dw₀`` for
``dz = α·((1 + 2ζ·lse)·softmax − (1 − ε)·onehot(label) − ε / V)`` (times ``1 − (z / cap)²`` under a
soft cap): the whole loss, z-loss, label smoothing and soft cap included. The backward pass reads
``s`` off ``d_lse`` and checks at run time that ``d_lse`` is ``s·α·(1 + 2ζ·lse)`` (to a relative
``2⁻²⁰``); then ``dx = s·dx₀``, ``dw = s·dw₀``, plus the exact terms of whatever else the cotangent
holds: ``(d_z_label + (1 − ε)·s·α)·onehot(label)`` (a gather of ``w``'s label columns and a scatter-add
into ``dw``, skipped where it is below ``2⁻²⁰`` of ``d_z_label``) and ``d_z_sum + (ε / V)·s·α`` (a
rank-one term, likewise skipped). Any other cotangent (an extra ``z_sum`` term under a soft cap,
which is not rank-one there; a caller of this VJP other than the op layer) takes the chunked backward
pass (logits recomputed: correct, and slower than the chunked implementation alone). The capability
gate refuses ``reduction="none"``, whose per-token cotangents the saved gradients cannot serve: the
per-token losses, and each shard of a vocabulary-parallel ``w`` (the op's shard rule calls the shards
so, their share of the log-sum-exp's cotangent being per token); ``platform="auto"`` then takes the
next implementation (``xla/any:chunked``).

Precision: ``dw`` is accumulated over the token chunks in ``w``'s dtype — each chunk's product
``x_cᵀ @ dz_c`` is added to it inside the matmul (cuBLAS's ``beta = 1``: float32 accumulation of
the product and the running ``dw``, rounded once per chunk), where the unfused gradient is one
float32-accumulated product rounded once; ``dx`` is rounded once per token, as in the unfused
gradient. The logits are in the inputs' dtype as ``x @ w`` computes them (``logits="input"``, the
default, as the unfused loss's) or float32 (``logits="float32"``, twice the traffic); the softmax is
float32 either way, the logits' cotangent in the inputs' dtype for the two products. The label's
logit is read from the chunk; the logits' sum is ``x · Σ_v w_v`` in float32 without a soft cap
(the sum of the capped logits with one).

Memory: a chunk's logits and their cotangent (``block_t · V`` of each) are the only temporaries that
grow with ``V``; ``dx₀`` and ``dw₀``, held from the forward to the backward pass, share their buffers
with the gradients they become (XLA's buffer assignment: on an H100 at T 16384, V 128k, bfloat16,
``block_t`` 1024, the program's temporaries are 552 MiB, the two chunks' 512 MiB and small vectors).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.plugin import VJP, cotangent_like, positive_int, varying_like
from ejk_xla import _linear_cross_entropy as chunked

__all__ = ["RESIDUALS", "GradInForwardConfig", "capability", "config_space", "heuristic_config", "linear_cross_entropy",
           "linear_cross_entropy_bwd", "linear_cross_entropy_fwd", "vjp"]

Precision = str | tuple[str, str]
Statistics = tuple[jax.Array, jax.Array, jax.Array]

#: This implementation's own residual format (no other implementation consumes it).
RESIDUALS = "ejk_xla.linear_cross_entropy:gradients-in-forward"

#: Relative tolerance of the backward pass's check that ``d_lse`` is the assumed one times a scalar.
PROPORTIONAL_TOLERANCE = 2.0**-20

#: The share of the unfused loss's temporaries one chunk's logits and cotangent may take (heuristic).
MEMORY_SHARE = 0.045


def _logits_choice(instance: Any, attribute: Any, value: str) -> None:
    if value not in ("float32", "input"):
        raise ValueError(f"GradInForwardConfig.logits is {value!r} but needs 'float32' or 'input'")


@attrs.frozen(kw_only=True)
class GradInForwardConfig:
    """Config of the gradients-in-forward linear cross-entropy.

    Attributes:
        block_t: Tokens per chunk (clipped to ``T``). A chunk holds ``block_t · V`` logits and as
            many of their cotangent (in the inputs' dtype).
        logits: ``"float32"``: the logits' product accumulates and writes float32; ``"input"``: it
            writes the inputs' dtype (as ``x @ w`` does), the softmax still computed in float32.
        backward: Config of the chunked backward pass that runs for a cotangent of another form.
    """

    block_t: int = attrs.field(default=1024, validator=positive_int)
    logits: str = attrs.field(default="input", validator=_logits_choice)
    backward: chunked.LinearCrossEntropyConfig | None = None


def capability(*, reduction: str = "mean", **_: Any) -> str | None:
    """Refuses ``reduction="none"`` (the per-token losses, or a vocabulary shard's statistics): its
    per-token cotangent is not the one the forward pass assumes."""
    if reduction == "none":
        return ("reduction='none' (per-token losses, or one vocabulary shard of a vocabulary-parallel w) gives "
                "each token its own cotangent, which the gradients computed in the forward pass do not serve "
                "(its backward would recompute the logits: 6 products); xla/any:chunked runs such calls with 4")
    return None


def _weights(labels: jax.Array, vocab: int, reduction: str) -> tuple[jax.Array, jax.Array]:
    """``(inside, α)``: which labels are in ``[0, vocab)``, and each token's weight in the loss: 1 over
    their count there for ``"mean"``, 1 there otherwise, 0 elsewhere."""
    inside = (labels >= 0) & (labels < vocab)
    if reduction != "mean":
        return inside, inside.astype(jnp.float32)
    count = jnp.maximum(jnp.sum(inside.astype(jnp.float32)), 1.0)
    return inside, jnp.where(inside, 1.0 / count, 0.0)


def _lse_weighted(values: jax.Array, lse: jax.Array, z_loss: float) -> jax.Array:
    """``values · (1 + 2ζ·lse)``: the z-loss's factor on the log-sum-exp's cotangent (none without z-loss)."""
    return values * (1.0 + (2.0 * z_loss) * lse) if z_loss else values


@functools.partial(jax.jit, static_argnames=("block_t", "cap", "precision", "logits", "reduction",
                                             "label_smoothing", "z_loss"))
def _forward_and_gradients(x: jax.Array, w: jax.Array, labels: jax.Array, *, block_t: int, cap: float | None,
                           precision: Precision, logits: str, reduction: str, label_smoothing: float,
                           z_loss: float) -> tuple[Statistics, jax.Array, jax.Array]:
    t, v = x.shape[0], w.shape[1]
    dtype = jnp.promote_types(x.dtype, w.dtype)
    w_c = w.astype(dtype)
    labels = labels.astype(jnp.int32)
    _, alpha = _weights(labels, v, reduction)
    row_starts = chunked._chunk_starts(t, block_t)
    nominal_rows = jnp.arange(row_starts.shape[0], dtype=jnp.int32) * block_t
    columns = jnp.arange(v, dtype=jnp.int32)[None, :]
    w_sums = jnp.sum(w_c.astype(jnp.float32), axis=1)
    dx_dtype = x.dtype if x.dtype == dtype else jnp.float32  # rounded once either way
    product_dtype = jnp.float32 if logits == "float32" else dtype

    def gradients_of(row: jax.Array, fresh: jax.Array) -> tuple[jax.Array, ...]:
        """One chunk's statistics, ``dx`` rows and ``dw`` term (rows an earlier chunk covered contribute 0)."""
        take = functools.partial(lax.dynamic_slice_in_dim, start_index=row, slice_size=block_t)
        x_c = take(x).astype(dtype)
        u = jnp.matmul(x_c, w_c, precision=precision, preferred_element_type=product_dtype).astype(jnp.float32)
        z = u if cap is None else cap * jnp.tanh(u / cap)
        top = jnp.max(z, axis=1)
        lse_c = top + jnp.log(jnp.sum(jnp.exp(z - top[:, None]), axis=1))
        label = take(labels)
        # The label's logit read from the chunk (a gather), the sum of the logits a product with the row
        # sums of w where there is no cap: neither is one more pass over the logits.
        inside = (label >= 0) & (label < v)
        picked = jnp.take_along_axis(z, jnp.clip(label, 0, v - 1)[:, None], axis=1)[:, 0]
        z_label_c = jnp.where(inside, picked, 0.0)
        if cap is None:
            z_sum_c = jnp.matmul(x_c.astype(jnp.float32), w_sums, precision="highest")  # a [block_t, H] matvec
        else:
            z_sum_c = jnp.sum(z, axis=1)
        a = jnp.where(fresh, take(alpha), 0.0)[:, None]
        p = _lse_weighted(jnp.exp(z - lse_c[:, None]), lse_c[:, None], z_loss)
        target = (columns == label[:, None]).astype(jnp.float32)
        if label_smoothing:  # (1 − ε)·onehot + ε / V
            target = (1.0 - label_smoothing) * target + label_smoothing / v
        dz = a * (p - target)
        if cap is not None:
            dz = dz * (1.0 - jnp.square(z / cap))
        dz = dz.astype(dtype)
        dx_c = jnp.matmul(dz, w_c.T, precision=precision, preferred_element_type=dx_dtype).astype(x.dtype)
        dw_c = jnp.matmul(x_c.T, dz, precision=precision, preferred_element_type=w.dtype)
        return dx_c, dw_c, lse_c, z_label_c, z_sum_c

    def chunk(carry: tuple[jax.Array, ...], rows: tuple[jax.Array, jax.Array]) -> tuple[Any, None]:
        dx, dw, *stats = carry
        row, row_nominal = rows
        fresh = chunked._fresh(row, block_t, row_nominal)  # rows no earlier chunk covered
        dx_c, dw_c, *stats_c = gradients_of(row, fresh)
        keep = lambda old, new, f: lax.dynamic_update_slice_in_dim(  # noqa: E731
            old, jnp.where(f, new, lax.dynamic_slice_in_dim(old, row, block_t)), row, 0)
        dx = keep(dx, dx_c, fresh[:, None])
        stats = [keep(old, new, fresh) for old, new in zip(stats, stats_c, strict=True)]
        return (dx, dw + dw_c, *stats), None  # the add is the product's accumulation (cuBLAS's beta = 1)

    # The first chunk starts dw (no zeros written and read back); the others add to it.
    dx_0, dw, *stats_0 = gradients_of(jnp.int32(0), jnp.ones((block_t,), bool))
    vector = jnp.zeros((t,), jnp.float32)
    dx, *stats = varying_like((jnp.zeros(x.shape, x.dtype), vector, vector, vector), x, w, labels)
    dx = lax.dynamic_update_slice_in_dim(dx, dx_0, 0, 0)
    stats = [lax.dynamic_update_slice_in_dim(old, new, 0, 0) for old, new in zip(stats, stats_0, strict=True)]
    (dx, dw, lse, z_label, z_sum), _ = lax.scan(chunk, (dx, dw, *stats), (row_starts[1:], nominal_rows[1:]))
    return (lse, z_label, z_sum), dx, dw


def _block_t(x: Any, w: Any, cfg: GradInForwardConfig | None) -> tuple[int, GradInForwardConfig]:
    cfg = cfg if cfg is not None else heuristic_config(x, w)
    return min(cfg.block_t, x.shape[0]), cfg


def linear_cross_entropy(
    x: jax.Array, w: jax.Array, labels: jax.Array, *, logit_soft_cap: float | None = None,
    precision: Precision = ("highest", "highest"), cfg: GradInForwardConfig | None = None,
    reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
) -> Statistics:
    """Per-token ``(lse, z_label, z_sum)`` of ``x @ w`` (soft-capped), each ``[T]`` float32.

    Not differentiated, this is the chunked implementation's forward pass (its heuristic config);
    the loss options matter only to the differentiated call.
    """
    del reduction, label_smoothing, z_loss
    backward = None if cfg is None else cfg.backward
    return chunked.linear_cross_entropy(x, w, labels, logit_soft_cap=logit_soft_cap, precision=precision,
                                        cfg=backward)


def linear_cross_entropy_fwd(
    x: jax.Array, w: jax.Array, labels: jax.Array, *, logit_soft_cap: float | None = None,
    precision: Precision = ("highest", "highest"), cfg: GradInForwardConfig | None = None,
    reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
) -> tuple[Statistics, tuple[jax.Array, ...]]:
    """``((lse, z_label, z_sum), (x, w, labels, lse, z_label, dx₀, dw₀))``: statistics and, at once, the
    gradients of the loss ``reduction``, ``label_smoothing`` and ``z_loss`` make of them."""
    block_t, cfg = _block_t(x, w, cfg)
    if block_t == 0:  # no tokens
        empty = jnp.zeros((0,), jnp.float32)
        return (empty, empty, empty), (x, w, labels, empty, empty, jnp.zeros_like(x), jnp.zeros_like(w))
    stats, dx, dw = _forward_and_gradients(x, w, labels, block_t=block_t, cap=logit_soft_cap, precision=precision,
                                           logits=cfg.logits, reduction=reduction,
                                           label_smoothing=float(label_smoothing), z_loss=float(z_loss))
    return stats, (x, w, labels, stats[0], stats[1], dx, dw)


def _scale(d_lse: jax.Array, assumed: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(s, fast)``: the scalar of ``d_lse = s·assumed``, and whether ``d_lse`` is that (to a relative
    :data:`PROPORTIONAL_TOLERANCE`). ``s`` is read where ``assumed`` is largest (0 where it is 0 everywhere)."""
    k = jnp.argmax(jnp.abs(assumed))
    s = jnp.where(assumed[k] != 0.0, d_lse[k] / jnp.where(assumed[k] != 0.0, assumed[k], 1.0), 0.0)
    bound = PROPORTIONAL_TOLERANCE * jnp.max(jnp.abs(d_lse))
    return s, jnp.all(jnp.abs(d_lse - s * assumed) <= bound)


def _beyond(extra: jax.Array, cotangent: jax.Array) -> jax.Array:
    """``extra`` (what a cotangent holds beyond the assumed one), 0 where all of it is rounding: within
    :data:`PROPORTIONAL_TOLERANCE` of the cotangent's largest entry."""
    small = jnp.all(jnp.abs(extra) <= PROPORTIONAL_TOLERANCE * jnp.max(jnp.abs(cotangent)))
    return jnp.where(small, 0.0, extra)


def _saved_gradients(x: jax.Array, w: jax.Array, labels: jax.Array, dx0: jax.Array, dw0: jax.Array, s: jax.Array,
                     extra: jax.Array, d_sum: jax.Array, *, onehot: bool) -> tuple[jax.Array, jax.Array]:
    """``s·(dx₀, dw₀)`` plus the ``z_sum`` term of the cotangent and, with ``onehot``, the ``extra`` onehot term.

    One pass over ``dw`` (written afresh: an unchanged ``dw₀`` returned through a ``cond`` would be
    copied), plus a gather of ``w``'s label columns and a scatter-add into ``dw`` for the onehot term.
    """
    f32 = jnp.float32
    row_sums = lax.cond(jnp.any(d_sum != 0.0), lambda: jnp.sum(w.astype(f32), axis=1),
                        lambda: varying_like(jnp.zeros((w.shape[0],), f32), w, d_sum))
    dx = s * dx0.astype(f32) + d_sum[:, None] * row_sums[None, :]
    dw = (s * dw0.astype(f32) + jnp.matmul(d_sum, x.astype(f32), precision="highest")[:, None]).astype(dw0.dtype)
    if onehot:
        safe = jnp.clip(labels, 0, w.shape[1] - 1)  # extra is 0 where the label is outside
        dx = dx + extra[:, None] * jnp.take(w, safe, axis=1).T.astype(f32)
        dw = dw.at[:, safe].add((x.astype(f32) * extra[:, None]).T.astype(dw.dtype))
    return dx.astype(dx0.dtype), dw


def linear_cross_entropy_bwd(
    residuals: tuple[jax.Array, ...], cotangents: tuple[Any, Any, Any], *, logit_soft_cap: float | None = None,
    precision: Precision = ("highest", "highest"), cfg: GradInForwardConfig | None = None,
    reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
) -> tuple[jax.Array, jax.Array, None]:
    """``(dx, dw, None)``: the saved gradients scaled, or the chunked backward pass for another cotangent."""
    x, w, labels, lse, z_label, dx0, dw0 = residuals
    if x.shape[0] == 0:
        return cotangent_like(jnp.zeros_like(x), x), cotangent_like(jnp.zeros_like(w), w), None
    d_lse, d_label, d_sum = (jnp.zeros_like(lse) if d is None else d.astype(jnp.float32) for d in cotangents)
    labels = labels.astype(jnp.int32)
    vocab, smoothing = w.shape[1], float(label_smoothing)
    inside, alpha = _weights(labels, vocab, reduction)
    s, fast = _scale(d_lse, _lse_weighted(alpha, lse, float(z_loss)))
    weight = s * alpha  # the loss's cotangent per token, as the saved gradients assume it
    # What the cotangents of the onehot and z_sum terms hold beyond what the saved gradients do.
    extra = _beyond(jnp.where(inside, d_label + (1.0 - smoothing) * weight, 0.0), d_label)
    if logit_soft_cap is not None:
        extra = extra * (1.0 - jnp.square(z_label / logit_soft_cap))
    extra_sum = _beyond(d_sum + (smoothing / vocab) * weight, d_sum)
    if logit_soft_cap is not None:  # the cotangent of z_sum times 1 − (z / cap)² is not rank-one
        fast = fast & jnp.all(extra_sum == 0.0)
    block_t, block_v = chunked._blocks(x, w, None if cfg is None else cfg.backward)

    def recomputed() -> tuple[jax.Array, jax.Array]:
        dx, dw = chunked._gradients(x, w, labels, lse, d_lse, d_label, d_sum, block_t=block_t, block_v=block_v,
                                    cap=logit_soft_cap, precision=precision)
        return dx, dw

    saved = functools.partial(_saved_gradients, x, w, labels, dx0, dw0, s, extra, extra_sum)
    branches: list[Callable[[], tuple[jax.Array, jax.Array]]] = [
        functools.partial(saved, onehot=False), functools.partial(saved, onehot=True), recomputed]
    which = jnp.where(fast, jnp.where(jnp.any(extra != 0.0), 1, 0), 2)
    dx, dw = lax.switch(which, branches)
    return cotangent_like(dx, x), cotangent_like(dw, w), None


#: The custom VJP: residuals ``(x, w, labels, lse, z_label, dx₀, dw₀)`` (:data:`RESIDUALS`, this implementation's own).
vjp = VJP(fwd=linear_cross_entropy_fwd, bwd=linear_cross_entropy_bwd, residuals=RESIDUALS)


def heuristic_config(x: Any, w: Any, **_: Any) -> GradInForwardConfig:
    """The largest power-of-two chunk (256 to 2048 tokens) whose logits and cotangent, ``2 · block_t · V``
    in the inputs' dtype, take at most :data:`MEMORY_SHARE` of what the unfused loss holds (``T · V`` in
    that dtype and in float32); 256 tokens on a CPU.

    At T 16384 in bfloat16 that is 1024 tokens: on an H100, forward + backward 1.00x and 1.01x the
    unfused loss at V 128k / 256k with 4.5% of its temporaries (2048 tokens: 1.03x, with 8.7%;
    ``benchmarks/results/lce_grad_in_forward_h100.md``).
    """
    if jax.default_backend() == "cpu":
        return GradInForwardConfig(block_t=256)
    itemsize = jnp.dtype(jnp.promote_types(x.dtype, w.dtype)).itemsize
    limit = MEMORY_SHARE * int(x.shape[0]) * (itemsize + 4) / (2 * itemsize)
    block_t = 2048
    while block_t > 256 and block_t > limit:
        block_t //= 2
    return GradInForwardConfig(block_t=block_t)


def config_space(x: Any, w: Any, **_: Any) -> list[GradInForwardConfig]:
    """Chunks of 512 to 2048 tokens (clipped to ``T``), float32 or input-dtype logits."""
    t = max(int(x.shape[0]), 1)
    seen: dict[tuple[int, str], GradInForwardConfig] = {}
    for block_t in (512, 1024, 2048):
        for logits in ("float32", "input"):
            seen.setdefault((min(block_t, t), logits), GradInForwardConfig(block_t=block_t, logits=logits))
    return list(seen.values())

