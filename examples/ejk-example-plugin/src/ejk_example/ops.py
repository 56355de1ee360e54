"""``rms_norm``: the public op this plugin adds, declared with the mechanism the built-in ops use.

:func:`ejk.ops.define_op` ties together the op's kernel (argument layout and validator), its public
function, its plain reference and its conformance check. Once this module is imported (the plugin
imports it when ejk loads it), ``ejk.example_rms_norm``, ``ejk.run("example_rms_norm", ...)``, ``ejk.explain``,
``ejk.testing.check_op("example_rms_norm", platform)`` and ``ejk kernels`` all know the op.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ejk.ops import OpKernel, define_op, run_op

__all__ = ["KERNEL", "RmsNormKernel", "rms_norm"]


def _is_float(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.floating))


class RmsNormKernel(OpKernel):
    """Dispatches ``rms_norm`` to the registered implementations."""

    op_id = "example_rms_norm"
    version = "1"
    array_names = ("x", "weight")
    positional = 2

    def normalize(self, x: Any, weight: Any, *, eps: float = 1e-6) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Validate a call: ``x`` ``[..., d]`` floating, ``weight`` ``[d]`` floating, ``eps > 0``."""
        x = jnp.asarray(x) if not hasattr(x, "shape") else x
        weight = jnp.asarray(weight) if not hasattr(weight, "shape") else weight
        if len(x.shape) < 1 or not _is_float(x.dtype):
            raise ValueError(f"example_rms_norm: x has shape {tuple(x.shape)} and dtype {jnp.dtype(x.dtype).name} "
                             "but needs at least one dimension [..., d] and a floating dtype")
        if tuple(weight.shape) != (x.shape[-1],) or not _is_float(weight.dtype):
            raise ValueError(f"example_rms_norm: weight has shape {tuple(weight.shape)} and dtype "
                             f"{jnp.dtype(weight.dtype).name} but needs shape ({x.shape[-1]},) (x's last "
                             "dimension) and a floating dtype")
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
            raise ValueError(f"example_rms_norm: eps is {eps!r} but needs a positive float, e.g. 1e-6")
        return (x, weight), {"eps": float(eps)}


KERNEL = RmsNormKernel()


def rms_norm(x: jax.Array, weight: jax.Array, *, eps: float = 1e-6, platform: str = "auto",
             cfg: Any = None) -> jax.Array:
    """Root-mean-square normalisation over the last dimension, scaled by ``weight``.

    ``x / sqrt(mean(x**2, -1) + eps) * weight``, computed in float32 and returned in ``x``'s dtype.
    Differentiable in ``x`` and ``weight``; works under ``jax.jit`` and ``jax.grad``.

    Args:
        x: ``[..., d]``, a floating dtype.
        weight: ``[d]``, a floating dtype.
        eps: Added to the mean square (positive).
        platform: ``"auto"`` or a platform name (as for every ejk op).
        cfg: An ``ejk.ImplChoice`` or an implementation's config (it always wins).

    Raises:
        ValueError: naming the argument, what it got and what it needs.
    """
    arrays, static = KERNEL.normalize(x, weight, eps=eps)
    return run_op(KERNEL, arrays, static, platform, cfg)  # type: ignore[no-any-return]


def samples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Small calls on which ``ejk doctor`` and ``ejk.testing.check_plugin`` run every implementation of
    ``rms_norm`` (its gate, heuristic, config space and output); the first also tells its static arguments."""
    return [((jax.ShapeDtypeStruct((8, 256), jnp.bfloat16), jax.ShapeDtypeStruct((256,), jnp.bfloat16)), {}),
            ((jax.ShapeDtypeStruct((2, 3, 64), jnp.float32), jax.ShapeDtypeStruct((64,), jnp.float32)), {"eps": 1e-5})]


DEFINITION = define_op(KERNEL, rms_norm, reference="ejk_example.reference:reference_rms_norm",
                       check="ejk_example.testing:check_rms_norm", samples=samples)
