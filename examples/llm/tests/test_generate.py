"""Paged generation (ejk.ragged_paged_attention, chunked prefill, ragged requests) matches a dense-cache
greedy decode of the same model on plain JAX, token for token."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from ejk_llm.config import get_preset
from ejk_llm.data import prompts
from ejk_llm.generate import DenseEngine, PagedEngine
from ejk_llm.model import init_params


def test_paged_generation_matches_dense_cache_greedy_decode() -> None:
    # Sliding layers of 16 keys with sinks; prompts of 1-12 tokens plus 14 new ones cross the window, the
    # 5-token chunks split prompts across prefill steps, and pages of 4 spread each request over many pages.
    cfg = get_preset("tiny").model
    params = init_params(cfg, jax.random.key(2))
    lens = (5, 12, 1, 9, 7)
    requests = prompts(cfg.vocab, lens)
    new = 14
    paged = PagedEngine(cfg, params, max_seqs=6, max_len=max(lens) + new, page_size=4, prefill_chunk=5)
    dense = DenseEngine(cfg, params, max_seqs=5, max_len=max(lens) + new)
    got, want = paged.generate(requests, new), dense.generate(requests, new)
    for s in range(len(lens)):
        np.testing.assert_array_equal(got.tokens[s], want.tokens[s], err_msg=f"request {s}")
    # 12 tokens in chunks of 5: 3 prefill steps, then decode steps until the last request has 14 tokens.
    assert got.steps == 3 + new - 1
    assert {len(t) for t in got.tokens} == {new}


def test_paged_engine_rejects_what_it_cannot_hold() -> None:
    cfg = dataclasses.replace(get_preset("tiny").model, n_layers=1)
    engine = PagedEngine(cfg, init_params(cfg, jax.random.key(0)), max_seqs=2, max_len=8, page_size=4,
                         prefill_chunk=4)
    with pytest.raises(ValueError, match="requests but the engine holds"):
        engine.generate([np.array([0, 1])] * 3, 2)
    with pytest.raises(ValueError, match="exceed the engine's max_len"):
        engine.generate([np.array([0, 1, 2, 3, 4, 5, 6])], 2)
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([np.zeros(0, np.int32)], 2)
