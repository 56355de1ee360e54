"""``flash_attention`` with segment ids on cuDNN's packed attention: each run of equal ids is a segment.

Packed training passes ``q_segment_ids == kv_segment_ids`` whose equal ids form one contiguous run
per document. ejk's rule is "query and key attend iff their ids are equal"; the runs of a row,
as cuDNN segments (:mod:`ejk_xla._cudnn_packed`, ``M = min(S, MAX_RUNS)`` segment slots per row),
give exactly that when, in every row,

- the query and key ids are equal (the same runs for both; ``Sq == Sk``, checked by the gate),
- no id comes back after another one (each id is one run: runs pairwise distinct), and
- there are at most ``M`` runs.

With equal query and key positions, a causal mask or a ``(left, 0)`` window of the whole row is
the same top-left mask inside each run, as cuDNN applies it. The ids are traced values, so the
three conditions are checked in the graph (``O(B * (S + M^2))``) and ``lax.cond`` takes cuDNN
when they hold, else ejk-xla's chunked kernel, exact for any ids (forward and backward alike).
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk_xla import _cudnn_packed, _flash_attention
from ejk_xla._cudnn_packed import Segments

__all__ = ["MAX_RUNS", "run_segments", "segment_attention", "segment_slots"]

#: Segment slots per batch row: rows with more runs of ids run the chunked fallback. jax keeps
#: ``[B * M, Hq, S]`` float32 softmax statistics for the backward, half of q's bytes at ``M = 32``
#: and ``D = 128`` in bfloat16.
MAX_RUNS = 32


def segment_slots(seq_len: int) -> int:
    """cuDNN segment slots per row for rows of ``seq_len`` tokens (at least 2: jax's packed layout)."""
    return max(min(seq_len, MAX_RUNS), 2)


def run_segments(q_segment_ids: jax.Array, kv_segment_ids: jax.Array) -> tuple[Segments, jax.Array]:
    """cuDNN's segments for the runs of ``q_segment_ids`` ``[B, S]``, and whether they are the call's mask.

    Returns:
        ``((seqlen, seqlen, offsets, offsets), fits)``: int32 ``[B, M]`` run lengths and ``[B, M + 1]``
        run starts (``-1`` past a row's runs), and a bool scalar: every row has at most ``M`` runs,
        no id in two runs, and ``kv_segment_ids`` equal to ``q_segment_ids``.
    """
    ids = q_segment_ids.astype(jnp.int32)
    batch, seq_len = ids.shape
    slots = segment_slots(seq_len)
    change = jnp.concatenate([jnp.ones((batch, 1), bool), ids[:, 1:] != ids[:, :-1]], axis=1)
    run = jnp.cumsum(change, axis=1, dtype=jnp.int32) - 1  # each token's run
    count = run[:, -1] + 1
    rows = jnp.arange(batch)[:, None]
    pos = jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32), ids.shape)
    starts = jnp.full((batch, slots), -1, jnp.int32).at[rows, jnp.where(change, run, slots)].set(pos, mode="drop")
    lengths = jnp.zeros((batch, slots), jnp.int32).at[rows, run].add(1, mode="drop")
    run_ids = jnp.zeros((batch, slots), jnp.int32).at[rows, run].set(ids, mode="drop")
    used = jnp.arange(slots)[None, :] < count[:, None]
    seqlen = jnp.where(used, lengths, -1)
    offsets = jnp.concatenate([jnp.where(used, starts, -1), jnp.full((batch, 1), -1, jnp.int32)], axis=1)
    pairs = used[:, :, None] & used[:, None, :] & ~jnp.eye(slots, dtype=bool)[None]
    repeated = jnp.any(pairs & (run_ids[:, :, None] == run_ids[:, None, :]))
    fits = jnp.all(count <= slots) & ~repeated & jnp.all(ids == kv_segment_ids.astype(jnp.int32))
    return (seqlen, seqlen, offsets, offsets), fits


@attrs.frozen
class _Plan:
    """A call's static arguments (a :class:`ejk_xla._cudnn_packed.Plan`); its fallback is ejk-xla's
    chunked flash attention with the segment ids, ``aux = (q_segment_ids, kv_segment_ids)``."""

    scale: float
    masked: bool
    window_length: int | None
    causal: bool
    sliding_window: tuple[int, int] | None

    def fallback(self, q: jax.Array, k: jax.Array, v: jax.Array, aux: Any) -> jax.Array:
        q_ids, kv_ids = aux
        return _flash_attention.flash_attention(
            q, k, v, causal=self.causal, softmax_scale=self.scale, sliding_window=self.sliding_window,
            logits_soft_cap=None, q_segment_ids=q_ids, kv_segment_ids=kv_ids, bias=None, precision="default")


def segment_attention(q: jax.Array, k: jax.Array, v: jax.Array, q_segment_ids: jax.Array,
                      kv_segment_ids: jax.Array, *, causal: bool, softmax_scale: float,
                      sliding_window: tuple[int, int] | None) -> jax.Array:
    """``flash_attention`` with segment ids (no bias, ``Sq == Sk``, a window of right reach 0: the gate's
    calls) on cuDNN's packed segments, or on the chunked kernel where the ids are not runs of distinct ids.

    Returns:
        ``[B, S, Hq, D]`` in ``q.dtype``.
    """
    heads, seq_len = q.shape[2], q.shape[1]
    if k.shape[2] != heads:  # jax scales the key offsets by q's heads: k / v need as many
        k, v = (jnp.repeat(x, heads // x.shape[2], axis=2) for x in (k, v))
    window_length = None
    if sliding_window is not None and sliding_window[0] < seq_len - 1:
        window_length = int(sliding_window[0]) + 1
    window = None if sliding_window is None else (int(sliding_window[0]), int(sliding_window[1]))
    plan = _Plan(scale=float(softmax_scale), masked=causal or sliding_window is not None,
                 window_length=window_length, causal=causal, sliding_window=window)
    segments, fits = run_segments(q_segment_ids, kv_segment_ids)
    out = _cudnn_packed.guarded(plan, q, k, v, (q_segment_ids, kv_segment_ids), segments, fits)
    return out.astype(q.dtype)
