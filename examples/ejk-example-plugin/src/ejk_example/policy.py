"""A team's config policy, applied through the ``ejk_choose_config`` hook.

The rule: *skinny matmuls* — 2-D or batched operands whose contraction ``K`` is at least
:data:`SKINNY_RATIO` times ``max(M, N)`` and at least :data:`MIN_K` — run the split-K
implementation with ``K / max(M, N)`` slices (a power of two, at most 16), whatever the caches
say. Everything else is left to the normal selection chain (``None``). An explicit ``cfg=``
always wins over the policy (the hook is not asked then); ``EJK_EXAMPLE_POLICY=0`` turns it off.
"""

from __future__ import annotations

import os
from typing import Any

from ejk.ops import ImplChoice
from ejk_example._split_k import SplitKConfig, heuristic_config

__all__ = ["MIN_K", "SKINNY_RATIO", "choose"]

SKINNY_RATIO = 8
MIN_K = 256


def choose(invocation: Any, kernel: Any) -> ImplChoice | None:
    """The policy's choice for one call, or ``None`` to let ejk decide."""
    if os.environ.get("EJK_EXAMPLE_POLICY", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if invocation.op_id != "matmul" or invocation.kwargs.get("platform", "auto") not in ("auto", "xla"):
        return None
    a, b = invocation.abstract_args[:2]
    if len(a.shape) < 2 or len(b.shape) < 2:
        return None
    m, k, n = int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1])
    if k < MIN_K or k < SKINNY_RATIO * max(m, n):
        return None
    cfg: SplitKConfig = heuristic_config(a, b)
    return ImplChoice(platform="xla", backend="any", implementation="split_k", cfg=cfg)
