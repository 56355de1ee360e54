"""``ejk.ssd``: the Mamba-2 state-space dual (scalar decay per head), chunked, with recurrent states."""

from __future__ import annotations

from typing import Any

import jax

from ejk.execution.kernel import Invocation
from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, run_op
from ejk.ops._check_common import as_array
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._gla._op import realistic_linear_args
from ejk.ops._ssd._check import check_ssd_args, check_ssd_values

__all__ = ["DEFINITION", "KERNEL", "SSD_RESIDUALS", "SsdKernel", "ssd"]

#: ``ejk.VJP.residuals`` of an ``ssd`` implementation whose residuals are its array operands
#: ``(x, dt, A, B, C, D, dt_bias, initial_state, cu_seqlens)``: its backward recomputes what it needs.
SSD_RESIDUALS = "ssd:inputs"


class SsdKernel(OpKernel):
    """Dispatches ``ssd`` to the registered implementations."""

    op_id = "ssd"
    version = "1"
    array_names = ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_state", "cu_seqlens")
    positional = 5

    def normalize(self, x: Any, dt: Any, A: Any, B: Any, C: Any, *, D: Any = None,  # noqa: N803
                  dt_bias: Any = None, dt_softplus: bool = False, initial_state: Any = None,
                  cu_seqlens: Any = None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        op = self.op_id
        given = (x, dt, A, B, C, D, dt_bias, initial_state, cu_seqlens)
        arrays = tuple(None if a is None else as_array(op, name, a)
                       for name, a in zip(self.array_names, given, strict=True))
        x, dt, A, B, C, D, dt_bias, initial_state, cu_seqlens = arrays  # noqa: N806
        check_ssd_args(x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, initial_state=initial_state,
                       cu_seqlens=cu_seqlens)
        return arrays, {"dt_softplus": dt_softplus}

    def tuning_args(self, inv: Invocation[ImplChoice], seed: int = 0) -> tuple[Any, ...]:
        args = list(realistic_linear_args(super().tuning_args(inv, seed), gates=(2,), cu_index=8, seed=seed))
        args[1] = jax.numpy.abs(args[1]) * 0.1  # small positive step sizes
        return tuple(args)


KERNEL = SsdKernel()


# whole: an unasked final state is never computed (as under jax.jit)
@eager_fast_path(KERNEL, get_default_executor, values=check_ssd_values, whole=True)
def ssd(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,  # noqa: N803
    B: jax.Array,  # noqa: N803
    C: jax.Array,  # noqa: N803
    *,
    D: jax.Array | None = None,  # noqa: N803
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = False,
    initial_state: jax.Array | None = None,
    output_final_state: bool = False,
    cu_seqlens: jax.Array | None = None,
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """The Mamba-2 state-space dual (SSD): a linear recurrence with one scalar decay per head and step.

    Per batch row and head ``h`` (reading group ``g = h // (H // G)`` of ``B`` and ``C``), with a
    state ``S [P, N]`` (float32) starting from ``initial_state`` (zeros when ``None``)::

        dt_t ← dt_t + dt_bias_h              (when dt_bias is given)
        dt_t ← softplus(dt_t)                (when dt_softplus)
        S_t  = exp(dt_t · A_h) S_{t-1} + dt_t x_t B_tᵀ
        y_t  = S_t C_t + D_h x_t             (the D term when D is given)

    Implementations run it by chunks (intra-chunk products plus state passing between chunks), as
    the Mamba-2 paper lays it out, never token by token. Decoding one token is the same call with
    ``T = 1``, the state in ``initial_state`` and out with ``output_final_state=True``.

    Args:
        x: ``[b, T, H, P]``.
        dt: ``[b, T, H]`` step sizes (raw when ``dt_softplus``); any floating dtype.
        A: ``[H]`` (negative for a decaying state: ``exp(dt·A) < 1``).
        B: ``[b, T, G, N]`` input projections; ``G`` divides ``H``.
        C: ``[b, T, G, N]`` output projections.
        D: ``[H]`` skip connection, or ``None``.
        dt_bias: ``[H]`` added to ``dt`` before the softplus, or ``None``.
        dt_softplus: Apply ``softplus`` to ``dt`` (after ``dt_bias``).
        initial_state: ``[N_seq, H, P, N]``, ``N_seq = b`` (or the number of sequences with
            ``cu_seqlens``); ``None`` means zeros.
        output_final_state: Also return the state after each row's (or sequence's) last token.
        cu_seqlens: ``[N_seq+1]`` int32 offsets of sequences packed along the tokens of one batch row
            (``b = 1``); each starts from its own initial state; empty sequences are allowed.
        platform: ``"auto"`` or a platform name to force.
        cfg: Explicit config; always wins.

    Returns:
        ``(y, final_state)``: ``y [b, T, H, P]`` in x's dtype and ``final_state [N_seq, H, P, N]``
        float32 (``None`` unless ``output_final_state``). Differentiable in x, dt, A, B, C, D,
        dt_bias and initial_state.
    """
    arrays, static = KERNEL.normalize(x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                      initial_state=initial_state, cu_seqlens=cu_seqlens)
    y, state = run_op(KERNEL, arrays, static, platform, cfg)
    return y, (state if output_final_state else None)


_HERE = __package__

DEFINITION = define_op(
    KERNEL, ssd,
    reference=f"{_HERE}._reference:reference_ssd",
    check=f"{_HERE}._conformance:check_ssd",
    shard_rule=f"{_HERE}._shard:ssd_rule",
    bench=f"{_HERE}._bench:BENCH",
    samples=f"{_HERE}._samples:samples",
    residuals=(SSD_RESIDUALS,),
)
