"""The one tolerance table of ejk: how close a result must be to its reference, per dtype and kind.

The conformance checks of :mod:`ejk.testing` and the autotuner's output check (:mod:`ejk.config.tuning`)
both read it; it sits low in the core so that neither imports the other.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

__all__ = ["TOLERANCES", "tolerance"]

#: The one tolerance table of every ejk test: ``(absolute, relative)`` per dtype, applied by
#: :func:`ejk.testing.assert_close` to values divided by the reference's largest magnitude (at least 1).
#: A row ``"<kind>:<dtype>"`` holds a tolerance of one kind of result (``assert_close(...,
#: kind=...)``); a kind without a row for a dtype falls back to the dtype's row.
TOLERANCES: dict[str, tuple[float, float]] = {
    # Any op's output, gradients included (attention outputs and cotangents of N(0, 1) inputs).
    "float32": (2e-5, 2e-5),
    "bfloat16": (3e-2, 3e-2),
    "float16": (5e-3, 5e-3),
    # Matmul-like ops (matmul, grouped_matmul): products are exact in float32, the rest is the
    # output's rounding and the summation order.
    "matmul:float32": (1e-5, 1e-5),
    "matmul:float16": (2e-3, 2e-3),
    "matmul:bfloat16": (1.6e-2, 1.6e-2),
    # float32 matmuls at precision="default", which may use TF32-class dots on a GPU.
    "matmul_default_precision:float32": (1e-2, 1e-2),
    # Ragged paged attention: each row averages few keys.
    "paged:float16": (4e-3, 4e-3),
    "paged:bfloat16": (2e-2, 2e-2),
    # The ops on an NVIDIA GPU: float32 dots at the default precision are TF32-class.
    "gpu:float32": (2e-3, 2e-3),
}


def tolerance(dtype: Any, kind: str | None = None) -> tuple[float, float]:
    """``(absolute, relative)`` of :data:`TOLERANCES`: the row ``"<kind>:<dtype>"``, else the dtype's.

    Raises:
        ValueError: for a dtype without a row.
    """
    name = jnp.dtype(dtype).name
    if kind is not None and f"{kind}:{name}" in TOLERANCES:
        return TOLERANCES[f"{kind}:{name}"]
    if name not in TOLERANCES:
        raise ValueError(f"no tolerance for dtype {name}: TOLERANCES has rows for "
                         f"{', '.join(k for k in TOLERANCES if ':' not in k)}")
    return TOLERANCES[name]
