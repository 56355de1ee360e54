"""The ring's static plan: a device's own keys (the diagonal step) run as one causal call in every layout."""

from __future__ import annotations

import numpy as np
import pytest

from ejk.parallel._layout import LAYOUTS, Piece, layout_positions
from ejk.parallel._ring import _BIG, _Block, _increasing, _Ring


def _ring(layout: str, shards: int, length: int, **options: object) -> _Ring:
    settings: dict[str, object] = dict(axis_name=None, num_shards=shards, layout=layout, q_len=length, kv_len=length,
                                       causal=True, window=None, scale=1.0, cap=None, platform="auto", cfg=None)
    return _Ring(**{**settings, **options})  # type: ignore[arg-type]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shards", [2, 4, 8])
def test_the_diagonal_step_is_one_causal_call_that_sees_what_the_global_mask_does(layout: str, shards: int) -> None:
    length = 16
    ring = _ring(layout, shards, length)
    for device in range(shards):
        assert ring.plan(device, 0) == (_Block(0, length, 0, length, (_BIG, 0)),)
        local = layout_positions(layout, shards * length, shards)[device * length:(device + 1) * length]
        assert (local[:, None] >= local[None, :]).tolist() == np.tril(np.ones((length, length), bool)).tolist()


def test_the_diagonal_keeps_its_pieces_where_one_call_would_not_match() -> None:
    """A window, or queries and keys of different lengths, keep the per-piece blocks."""
    windowed = _ring("zigzag", 4, 16, window=(3, 0))
    assert len(windowed.plan(1, 0)) > 1
    assert len(_ring("zigzag", 4, 16, kv_len=32).plan(1, 0)) > 1


def test_increasing_positions() -> None:
    def piece(offset: int, start: int, stride: int = 1) -> Piece:
        return Piece(offset=offset, length=4, start=start, stride=stride)

    assert _increasing([piece(0, 0), piece(4, 20)])
    assert not _increasing([piece(0, 10), piece(4, 0)])
    assert not _increasing([piece(0, 10, -1)])
