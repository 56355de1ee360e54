"""``ejk.linear_cross_entropy``: the cross-entropy of ``x @ w`` without ever holding the logits.

Implementations compute three per-token statistics of the logits ``z = x @ w`` (soft-capped when
asked), chunk by chunk: the log-sum-exp, the label's logit and the sum of the logits. The loss is
assembled from them here, in plain ``jnp`` on ``[T]`` vectors, so that every implementation gets
label smoothing, z-loss, ignored tokens and reductions right by construction, and a vocabulary
split over devices only has to combine the statistics (``_shard``).

The loss options (``reduction``, ``label_smoothing``, ``z_loss``) reach the implementations too, as
advisory extension arguments (:data:`LOSS_OPTIONS`): an implementation that names them may use them
(ejk-xla's ``grad_in_forward`` computes the gradients of that loss in its forward pass); one that
does not is called without them and stays correct, since its statistics do not depend on them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ejk._contract import Extension
from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, run_op
from ejk.ops._check_common import as_array, matmul_precision
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._linear_cross_entropy._check import (
    check_linear_cross_entropy_args,
    check_linear_cross_entropy_values,
    check_loss_options,
)
from ejk.ops._matmul._op import DEFAULT_PRECISION

__all__ = ["DEFINITION", "KERNEL", "LINEAR_CROSS_ENTROPY_RESIDUALS", "LOSS_OPTIONS", "LinearCrossEntropyKernel",
           "linear_cross_entropy", "loss_from_statistics", "statistics_output"]

#: Residual format of the implementations' custom VJPs: ``(x, w, labels, lse)``, ``lse`` the
#: per-token natural log-sum-exp ``[T]`` float32 (see docs/KERNEL_CONTRACT.md).
LINEAR_CROSS_ENTROPY_RESIDUALS = "linear_cross_entropy:x+w+labels+lse"

#: The loss options, passed to the implementations that name them (advisory: the statistics an
#: implementation returns do not depend on them, so one that does not name them is never refused).
LOSS_OPTIONS = (Extension("reduction", legacy="mean", since="0.2.0", advisory=True),
                Extension("label_smoothing", legacy=0.0, since="0.2.0", advisory=True),
                Extension("z_loss", legacy=0.0, since="0.2.0", advisory=True))


class LinearCrossEntropyKernel(OpKernel):
    """Dispatches ``linear_cross_entropy``'s per-token statistics to the registered implementations."""

    op_id = "linear_cross_entropy"
    version = "1"
    array_names = ("x", "w", "labels")
    positional = 3
    extensions = LOSS_OPTIONS

    def normalize(
        self, x: Any, w: Any, labels: Any, *, ignore_index: Any = -100, reduction: Any = "mean",
        label_smoothing: Any = 0.0, z_loss: Any = 0.0, logit_soft_cap: Any = None,
        precision: Any = DEFAULT_PRECISION,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        op = "linear_cross_entropy"
        ignore, reduce, smoothing, z_weight, cap = check_loss_options(
            ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss,
            logit_soft_cap=logit_soft_cap)
        x, w, labels = as_array(op, "x", x), as_array(op, "w", w), as_array(op, "labels", labels)
        check_linear_cross_entropy_args(x, w, labels, ignore_index=ignore)
        return (x, w, labels), {"logit_soft_cap": cap, "precision": matmul_precision(op, precision),
                                "reduction": reduce, "label_smoothing": smoothing, "z_loss": z_weight}


KERNEL = LinearCrossEntropyKernel()


def statistics_output(x: Any, w: Any, labels: Any, **_: Any) -> tuple[jax.ShapeDtypeStruct, ...]:
    """What every implementation returns: ``(lse, z_label, z_sum)``, each ``[T]`` float32."""
    del w, labels
    vector = jax.ShapeDtypeStruct((x.shape[0],), jnp.float32)
    return vector, vector, vector


def loss_from_statistics(
    lse: jax.Array, z_label: jax.Array, z_sum: jax.Array, labels: jax.Array, *, vocab: int, ignore_index: int,
    reduction: str, label_smoothing: float, z_loss: float,
) -> jax.Array:
    """The loss from the per-token statistics: ``(1−ε)(lse − z_y) + ε(lse − mean(z)) + z_loss·lse²``.

    Tokens whose label is ``ignore_index`` or outside ``[0, vocab)`` contribute nothing and are not
    counted by ``"mean"`` (which is 0 when every token is ignored).
    """
    valid = (labels != ignore_index) & (labels >= 0) & (labels < vocab)
    per_token = lse - (1.0 - label_smoothing) * z_label - (label_smoothing / vocab) * z_sum
    if z_loss:
        per_token = per_token + z_loss * jnp.square(lse)
    per_token = jnp.where(valid, per_token, 0.0)
    if reduction == "none":
        return per_token
    total = jnp.sum(per_token)
    if reduction == "sum":
        return total
    return total / jnp.maximum(jnp.sum(valid.astype(jnp.float32)), 1.0)


def _ignored_out_of_vocabulary(arrays: tuple[Any, ...], ignore_index: int) -> tuple[Any, ...]:
    """``(x, w, labels)`` with an in-vocabulary ``ignore_index`` replaced by a label outside ``[0, V)``
    (-1, or the dtype's largest value for unsigned labels), so that implementations see exactly the
    counted tokens as the ones with a label in ``[0, V)``."""
    x, w, labels = arrays
    vocab = w.shape[1]
    if not 0 <= ignore_index < vocab:
        return arrays
    dtype = jnp.dtype(labels.dtype)
    outside = -1 if jnp.issubdtype(dtype, jnp.signedinteger) else int(jnp.iinfo(dtype).max)
    if outside != -1 and outside < vocab:  # no unsigned value of this dtype lies outside the vocabulary
        return arrays
    return x, w, jnp.where(labels == ignore_index, jnp.asarray(outside, dtype), labels)


@eager_fast_path(KERNEL, get_default_executor, values=check_linear_cross_entropy_values, whole=True)
def linear_cross_entropy(
    x: jax.Array,
    w: jax.Array,
    labels: jax.Array,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    logit_soft_cap: float | None = None,
    precision: Any = DEFAULT_PRECISION,
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> jax.Array:
    """Cross-entropy of the logits ``x @ w`` against ``labels``, never materialising ``[T, V]`` logits.

    Per token, with ``z = x @ w`` (``cap · tanh(z / cap)`` first when ``logit_soft_cap`` is given),
    ``lse = logsumexp(z)`` and ``ε = label_smoothing``::

        loss = (1 − ε)(lse − z[label]) + ε(lse − mean(z)) + z_loss · lse²

    The implementations work on chunks of tokens and vocabulary and recompute the logits in the
    backward pass (or, ejk-xla's ``grad_in_forward``, compute the gradients in the forward pass chunk
    by chunk), so the temporary memory of forward and backward does not grow with ``T · V``.

    Args:
        x: ``[T, H]`` hidden states (flatten batch and sequence first); bfloat16, float16 or float32.
        w: ``[H, V]`` output projection (Flax's ``Dense`` kernel layout; tied embeddings ``[V, H]``
            pass ``embedding.T``); bfloat16, float16 or float32.
        labels: ``[T]`` integer targets in ``[0, V)``, or ``ignore_index``.
        ignore_index: Tokens with this label contribute nothing and are not counted by ``"mean"``.
            Other labels outside ``[0, V)`` are an error in an eager call; under ``jax.jit``
            (where values cannot be checked) they are treated as ignored.
        reduction: ``"mean"`` over the counted tokens (0 when every token is ignored), ``"sum"``,
            or ``"none"`` (``[T]``, 0 for ignored tokens).
        label_smoothing: ``ε`` in ``[0, 1]``: the target puts ``ε / V`` on every class and
            ``1 − ε`` more on the label.
        z_loss: Weight of ``lse²`` (PaLM's auxiliary loss keeping the log-partition near 0); ``>= 0``.
        logit_soft_cap: ``None`` or ``cap > 0``: the logits are ``cap · tanh(z / cap)``.
        precision: Of the products ``x @ w`` (forward and backward), as for :func:`matmul`;
            default ``"highest"``; ``"default"`` is the backend's fast path.
        platform: ``"auto"`` or a platform name to force.
        cfg: Explicit config; always wins.

    Returns:
        float32: a scalar for ``"mean"`` and ``"sum"``, ``[T]`` for ``"none"``. Differentiable in
        ``x`` and ``w`` (gradients in their dtypes).
    """
    ignore, reduce, smoothing, z_weight, _ = check_loss_options(
        ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss,
        logit_soft_cap=logit_soft_cap)
    arrays, static = KERNEL.normalize(x, w, labels, ignore_index=ignore, reduction=reduce,
                                      label_smoothing=smoothing, z_loss=z_weight, logit_soft_cap=logit_soft_cap,
                                      precision=precision)
    arrays = _ignored_out_of_vocabulary(arrays, ignore)
    lse, z_label, z_sum = run_op(KERNEL, arrays, static, platform, cfg)
    return loss_from_statistics(lse, z_label, z_sum, arrays[2], vocab=arrays[1].shape[1], ignore_index=ignore,
                                reduction=reduce, label_smoothing=smoothing, z_loss=z_weight)


_HERE = __package__

DEFINITION = define_op(
    KERNEL, linear_cross_entropy,
    reference=f"{_HERE}._reference:reference_linear_cross_entropy",
    check=f"{_HERE}._conformance:check_linear_cross_entropy",
    shard_rule=f"{_HERE}._shard:linear_cross_entropy_rule",
    bench=f"{_HERE}._bench:BENCH",
    samples=f"{_HERE}._samples:samples",
    output=statistics_output,
    residuals=(LINEAR_CROSS_ENTROPY_RESIDUALS,),
)
