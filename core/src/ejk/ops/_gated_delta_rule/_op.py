"""``ejk.gated_delta_rule``: the gated delta rule (Gated DeltaNet) linear-attention recurrence."""

from __future__ import annotations

from typing import Any

import jax

from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, run_op
from ejk.ops._check_common import as_array
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._gated_delta_rule._check import check_flag, check_gated_delta_rule_args, check_gated_delta_rule_values

__all__ = ["DEFINITION", "GATED_DELTA_RULE", "GatedDeltaRuleKernel", "gated_delta_rule"]


class GatedDeltaRuleKernel(OpKernel):
    """Dispatches ``gated_delta_rule``; every implementation returns ``(o, final_state)``."""

    op_id = "gated_delta_rule"
    version = "1"
    array_names = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens")
    positional = 5

    def normalize(
        self, q: Any, k: Any, v: Any, g: Any, beta: Any, *, initial_state: Any = None, cu_seqlens: Any = None,
        scale: Any = None, use_qk_l2norm: Any = False, output_final_state: Any = False,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The implementations' arrays and static arguments (``scale`` resolved, ``use_qk_l2norm``).

        ``output_final_state`` is checked here but is not the implementations' business: they always
        return ``(o, final_state)``, and the public function drops the state when it is not asked for.
        """
        op = self.op_id
        check_flag(op, "output_final_state", output_final_state)
        q, k, v, g, beta = (as_array(op, n, x) for n, x in zip(self.array_names, (q, k, v, g, beta), strict=False))
        initial_state = None if initial_state is None else as_array(op, "initial_state", initial_state)
        cu_seqlens = None if cu_seqlens is None else as_array(op, "cu_seqlens", cu_seqlens)
        resolved = check_gated_delta_rule_args(q, k, v, g, beta, initial_state, cu_seqlens, scale)
        static = {"scale": resolved, "use_qk_l2norm": check_flag(op, "use_qk_l2norm", use_qk_l2norm)}
        return (q, k, v, g, beta, initial_state, cu_seqlens), static


GATED_DELTA_RULE = GatedDeltaRuleKernel()


# whole: an unasked final state is never computed (as under jax.jit)
@eager_fast_path(GATED_DELTA_RULE, get_default_executor, values=check_gated_delta_rule_values,
                 whole=True)
def gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    output_final_state: bool = False,
    cu_seqlens: jax.Array | None = None,
    use_qk_l2norm: bool = False,
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """The gated delta rule (Gated DeltaNet), computed chunk by chunk.

    Per head, with a state ``S [K, V]`` (float32) and for each token t in order::

        S ← S · exp(g_t)
        u = β_t (v_t − kₜᵀ S)
        S ← S + k_t uᵀ
        o_t = scale · qₜᵀ S

    Args:
        q: ``[B, T, H, K]``.
        k: ``[B, T, H, K]`` (same dtype as ``q``).
        v: ``[B, T, H, V]`` (same dtype as ``q``).
        g: ``[B, T, H]`` log decay (≤ 0 for a decay; any floating dtype).
        beta: ``[B, T, H]`` writing strength (usually in ``(0, 1)``; any floating dtype).
        scale: Of the output; ``None`` means ``K ** -0.5``.
        initial_state: ``[N, H, K, V]`` states before the first token (``N = B``, or the number of
            packed sequences with ``cu_seqlens``); ``None`` means zeros. Any floating dtype.
        output_final_state: Also return the states after the last token.
        cu_seqlens: ``[N + 1]`` int32 offsets of packed sequences (then ``B = 1``): sequence ``n``
            is tokens ``cu_seqlens[n]:cu_seqlens[n + 1]``, starting from ``initial_state[n]``;
            empty sequences are allowed (their final state is their initial state).
        use_qk_l2norm: Normalise ``q`` and ``k`` over ``K`` first (``x / sqrt(Σx² + 1e-6)``),
            differentiated through.
        platform: ``"auto"`` or a platform name to force.
        cfg: Explicit config; always wins.

    Returns:
        ``(o, final_state)``: ``o [B, T, H, V]`` in ``q.dtype``; ``final_state [N, H, K, V]``
        float32 with ``output_final_state``, else ``None``. Differentiable in ``q, k, v, g, beta``
        and ``initial_state``.
    """
    arrays, static = GATED_DELTA_RULE.normalize(q, k, v, g, beta, initial_state=initial_state,
                                                cu_seqlens=cu_seqlens, scale=scale, use_qk_l2norm=use_qk_l2norm,
                                                output_final_state=output_final_state)
    o, final_state = run_op(GATED_DELTA_RULE, arrays, static, platform, cfg)
    return o, (final_state if output_final_state else None)


_HERE = __package__

DEFINITION = define_op(
    GATED_DELTA_RULE, gated_delta_rule,
    reference=f"{_HERE}._reference:reference_gated_delta_rule",
    check=f"{_HERE}._conformance:check_gated_delta_rule",
    shard_rule=f"{_HERE}._shard:gated_delta_rule_rule",
    bench=f"{_HERE}._bench:BENCH",
    samples=f"{_HERE}._samples:samples",
)
