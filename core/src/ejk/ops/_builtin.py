"""The built-in operations: one folder each, ``ejk/ops/_<name>/``, which defines it when imported.

Adding a built-in op is its folder and its name here (and, for static typing, re-exporting its
public function from :mod:`ejk.ops` and :mod:`ejk`).
"""

from __future__ import annotations

import importlib

from ejk.ops._definition import OpDefinition, get_op

__all__ = ["BUILTIN_OPS", "builtin_ops"]

#: The built-in operations, in the order ``ejk bench`` measures them.
BUILTIN_OPS = ("flash_attention", "flash_attention_varlen", "ragged_paged_attention", "mla_paged_attention",
               "grouped_matmul", "matmul", "gated_delta_rule", "gla", "ssd", "linear_cross_entropy", "rms_norm")


def builtin_ops() -> tuple[OpDefinition, ...]:
    """The definitions of the built-in operations (defining them on first use)."""
    for name in BUILTIN_OPS:
        importlib.import_module(f"ejk.ops._{name}")
    return tuple(get_op(name) for name in BUILTIN_OPS)
