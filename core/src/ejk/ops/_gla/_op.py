"""``ejk.gla``: gated linear attention (per-channel forget gates), chunked, with recurrent states."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ejk.execution.kernel import Invocation
from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, run_op
from ejk.ops._check_common import as_array
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._gla._check import check_gla_args, check_gla_values

__all__ = ["DEFINITION", "GLA_RESIDUALS", "KERNEL", "GlaKernel", "gla", "realistic_linear_args"]

#: ``ejk.VJP.residuals`` of a ``gla`` implementation whose residuals are its array operands
#: ``(q, k, v, g, initial_state, cu_seqlens)``: its backward recomputes what it needs.
GLA_RESIDUALS = "gla:inputs"


def realistic_linear_args(args: tuple[Any, ...], gates: tuple[int, ...], cu_index: int,
                          seed: int) -> tuple[Any, ...]:
    """Autotuning inputs with meaning: log gates ``<= 0`` (log-sigmoid of normals) at ``gates`` and, at
    ``cu_index``, sequences of equal lengths instead of the default's zeros."""
    jnp = jax.numpy
    rng = np.random.default_rng(seed)
    out = list(args)
    for i in gates:
        x = out[i]
        out[i] = jax.nn.log_sigmoid(jnp.asarray(rng.standard_normal(x.shape, np.float32) + 3.0)).astype(x.dtype)
    cu = out[cu_index]
    if cu is not None:
        n, tokens = cu.shape[0] - 1, args[0].shape[1]
        out[cu_index] = jnp.asarray(np.linspace(0, tokens, n + 1).astype(np.int64), cu.dtype)
    return tuple(out)


class GlaKernel(OpKernel):
    """Dispatches ``gla`` to the registered implementations."""

    op_id = "gla"
    version = "1"
    array_names = ("q", "k", "v", "g", "initial_state", "cu_seqlens")
    positional = 4

    def normalize(self, q: Any, k: Any, v: Any, g: Any, *, scale: float | None = None, initial_state: Any = None,
                  cu_seqlens: Any = None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        op = self.op_id
        q, k, v, g = (as_array(op, name, x) for name, x in zip("qkvg", (q, k, v, g), strict=True))
        initial_state, cu_seqlens = (None if x is None else as_array(op, name, x) for name, x in (
            ("initial_state", initial_state), ("cu_seqlens", cu_seqlens)))
        resolved = check_gla_args(q, k, v, g, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens)
        return (q, k, v, g, initial_state, cu_seqlens), {"scale": resolved}

    def tuning_args(self, inv: Invocation[ImplChoice], seed: int = 0) -> tuple[Any, ...]:
        return realistic_linear_args(super().tuning_args(inv, seed), gates=(3,), cu_index=5, seed=seed)


KERNEL = GlaKernel()


# whole: an unasked final state is never computed (as under jax.jit)
@eager_fast_path(KERNEL, get_default_executor, values=check_gla_values, whole=True)
def gla(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    *,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    output_final_state: bool = False,
    cu_seqlens: jax.Array | None = None,
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """Gated linear attention (GLA): a linear recurrence with per-channel forget gates.

    Per batch row and head, with a state ``S [K, V]`` (float32) starting from ``initial_state``
    (zeros when ``None``)::

        S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ
        o_t = scale · S_tᵀ q_t

    Implementations run it by chunks (intra-chunk products plus state passing between chunks),
    never token by token. Decoding one token is the same call with ``T = 1``, the state in
    ``initial_state`` and out with ``output_final_state=True``.

    Args:
        q: ``[B, T, H, K]``.
        k: ``[B, T, H, K]``, q's dtype.
        v: ``[B, T, H, V]``, q's dtype.
        g: ``[B, T, H, K]`` log forget gates (``<= 0``, e.g. ``log_sigmoid`` of a projection); any
            floating dtype (float32 keeps long products of gates accurate).
        scale: Output scale: ``None`` (``K ** -0.5``) or a finite number > 0.
        initial_state: ``[N, H, K, V]``, ``N = B`` (or the number of sequences with ``cu_seqlens``),
            any floating dtype; ``None`` means zeros.
        output_final_state: Also return the state after each row's (or sequence's) last token.
        cu_seqlens: ``[N+1]`` int32 offsets of ``N`` sequences packed along the tokens of one batch
            row (``B = 1``): sequence ``n`` is tokens ``cu_seqlens[n]:cu_seqlens[n+1]``, each starts
            from its own initial state and none sees another; empty sequences are allowed.
        platform: ``"auto"`` or a platform name to force.
        cfg: Explicit config; always wins.

    Returns:
        ``(o, final_state)``: ``o [B, T, H, V]`` in q's dtype and ``final_state [N, H, K, V]``
        float32 (``None`` unless ``output_final_state``). A sequence without tokens returns its
        initial state. Differentiable in q, k, v, g and initial_state.
    """
    arrays, static = KERNEL.normalize(q, k, v, g, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens)
    o, state = run_op(KERNEL, arrays, static, platform, cfg)
    return o, (state if output_final_state else None)


_HERE = __package__

DEFINITION = define_op(
    KERNEL, gla,
    reference=f"{_HERE}._reference:reference_gla",
    check=f"{_HERE}._conformance:check_gla",
    shard_rule=f"{_HERE}._shard:gla_rule",
    bench=f"{_HERE}._bench:BENCH",
    samples=f"{_HERE}._samples:samples",
    residuals=(GLA_RESIDUALS,),
)
