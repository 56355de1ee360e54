"""The conformance check of ``linear_cross_entropy``: every loss option, ignored tokens, values and gradients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._linear_cross_entropy._op import linear_cross_entropy
from ejk.ops._linear_cross_entropy._reference import reference_linear_cross_entropy
from ejk.testing._op_checks import check_aval, compare, normal

__all__ = ["LINEAR_CROSS_ENTROPY_CASES", "check_linear_cross_entropy"]

#: ``(T, H, V, ignored, options)`` of :func:`check_linear_cross_entropy`; ``ignored`` is
#: ``"some"``, ``"all"`` or ``"none"`` of the tokens labelled ``ignore_index``.
LINEAR_CROSS_ENTROPY_CASES: tuple[tuple[int, int, int, str, dict[str, Any]], ...] = (
    (8, 16, 37, "some", {}),
    (13, 8, 100, "none", {"reduction": "sum", "label_smoothing": 0.1, "z_loss": 1e-3}),
    (6, 16, 64, "some", {"reduction": "none", "logit_soft_cap": 3.0}),
    (9, 8, 50, "some", {"label_smoothing": 0.2, "z_loss": 1e-2, "logit_soft_cap": 5.0, "ignore_index": 7}),
    (5, 8, 20, "all", {}),
    (1, 4, 1, "none", {}),
    (0, 8, 10, "none", {"reduction": "sum"}),
)


def _labels(rng: np.random.Generator, t: int, v: int, ignored: str, ignore_index: int) -> jax.Array:
    labels = rng.integers(0, v, size=t)
    if ignored == "all":
        labels[:] = ignore_index
    elif ignored == "some":
        labels[::3] = ignore_index
    return jnp.asarray(labels, jnp.int32)


def check_linear_cross_entropy(
    platform: str,
    *,
    dtypes: Sequence[Any] = (jnp.float32, jnp.bfloat16),
    cfg: Any = None,
    precision: Any = "highest",
    cases: Sequence[tuple[int, int, int, str, dict[str, Any]]] = LINEAR_CROSS_ENTROPY_CASES,
) -> int:
    """``ejk.linear_cross_entropy`` on ``platform`` against the reference, with the gradients of
    ``x`` and ``w``; returns the cases run. Tolerances are those of the input dtype."""
    for dtype in dtypes:
        for seed, (t, h, v, ignored, options) in enumerate(cases):
            rng = np.random.default_rng(seed)
            x, w = normal(rng, (t, h), dtype), normal(rng, (h, v), dtype)
            labels = _labels(rng, t, v, ignored, options.get("ignore_index", -100))
            label = (f"linear_cross_entropy[{platform}] T={t} H={h} V={v} {ignored} ignored "
                     f"{jnp.dtype(dtype).name} {options}")

            def ours(x: jax.Array, w: jax.Array, labels: jax.Array = labels, options: Any = options) -> jax.Array:
                return linear_cross_entropy(x, w, labels, precision=precision, platform=platform, cfg=cfg, **options)

            def ref(x: jax.Array, w: jax.Array, labels: jax.Array = labels, options: Any = options) -> jax.Array:
                return reference_linear_cross_entropy(x, w, labels, precision=precision, **options)

            want = jax.eval_shape(ref, x.astype(jnp.float32), w.astype(jnp.float32))
            check_aval(jax.eval_shape(ours, x, w), want, label)
            compare(ours, ref, (x, w), dtype, label, grads=True)
    return len(dtypes) * len(cases)
