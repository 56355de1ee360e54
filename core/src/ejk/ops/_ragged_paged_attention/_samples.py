"""Sample calls of ``ragged_paged_attention`` (``ejk doctor`` and ``ejk.testing.check_plugin`` run every
implementation on them)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["samples"]


def samples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Three bfloat16 sequences of ragged query and context lengths over pages of 4 positions."""
    q_lens, kv_lens, page, per_seq = (3, 1, 5), (9, 4, 12), 4, 3
    pages = len(kv_lens) * per_seq
    table = np.arange(pages, dtype=np.int32).reshape(len(kv_lens), per_seq)
    return [((jax.ShapeDtypeStruct((sum(q_lens), 4, 16), jnp.bfloat16),
              jax.ShapeDtypeStruct((pages, page, 2, 16), jnp.bfloat16),
              jax.ShapeDtypeStruct((pages, page, 2, 16), jnp.bfloat16),
              np.asarray(kv_lens, np.int32), table, np.cumsum([0, *q_lens]).astype(np.int32), len(kv_lens)), {})]

