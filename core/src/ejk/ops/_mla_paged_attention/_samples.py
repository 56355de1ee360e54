"""Sample calls of ``mla_paged_attention`` (``ejk doctor`` and ``ejk.testing.check_plugin`` run every
implementation on them)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["samples"]


def samples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """bfloat16 decode of three ragged contexts, and causal two-token prediction, over pages of 4."""
    kv_lens, page, per_seq, dk, dv = (9, 4, 12), 4, 3, 80, 64
    pages = len(kv_lens) * per_seq
    table = np.arange(pages, dtype=np.int32).reshape(len(kv_lens), per_seq)[:, ::-1].copy()
    kv = jax.ShapeDtypeStruct((pages, page, dk), jnp.bfloat16)
    lens = np.asarray(kv_lens, np.int32)
    return [((jax.ShapeDtypeStruct((3, 1, 8, dk), jnp.bfloat16), kv, lens, table), {"v_head_dim": dv}),
            ((jax.ShapeDtypeStruct((3, 2, 4, dk), jnp.bfloat16), kv, lens, table), {"v_head_dim": dv})]
