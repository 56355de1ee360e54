"""Packed synthetic batches and the presets (no compilation: fast)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ejk_llm.config import PRESETS, ModelConfig, get_preset
from ejk_llm.data import BOS, IGNORE, SyntheticCorpus


@pytest.mark.parametrize(("rows", "seq_len", "min_doc", "max_doc"), [(3, 64, 8, 48), (2, 50, 2, 3), (1, 16, 40, 60)])
def test_packed_rows(rows: int, seq_len: int, min_doc: int, max_doc: int) -> None:
    max_docs = -(-seq_len // min_doc) + 1
    batch = SyntheticCorpus(64, min_doc, max_doc, seed=5).batch(rows, seq_len, max_docs)
    assert batch.tokens.shape == batch.positions.shape == batch.labels.shape == (rows, seq_len)
    assert batch.cu_seqlens.shape == (rows, max_docs + 1)
    for b in range(rows):
        cu = batch.cu_seqlens[b]
        assert cu[0] == 0 and cu[-1] == seq_len and np.all(np.diff(cu) >= 0)
        for s in range(max_docs):
            lo, hi = cu[s], cu[s + 1]
            if lo == hi:
                continue
            assert batch.tokens[b, lo] == BOS
            np.testing.assert_array_equal(batch.positions[b, lo:hi], np.arange(hi - lo))
            np.testing.assert_array_equal(batch.labels[b, lo:hi - 1], batch.tokens[b, lo + 1:hi])
            assert batch.labels[b, hi - 1] == IGNORE  # no label crosses into the next document
            assert hi - lo >= min(min_doc, seq_len - lo)  # only a row's last document is cut
        assert np.all((batch.tokens[b] >= 0) & (batch.tokens[b] < 64))


def test_the_language_is_learnable() -> None:
    """Each token's successor is one of 4 (or a copy): far below log(vocab) for a model that learns it."""
    corpus = SyntheticCorpus(256, 32, 32, seed=0)
    docs = [corpus.document() for _ in range(200)]
    pairs = {(int(a), int(b)) for doc in docs for a, b in itertools.pairwise(doc[1:])}
    successors = np.bincount([a for a, _ in pairs], minlength=256)
    assert np.median(successors[successors > 0]) <= 12


def test_data_errors() -> None:
    with pytest.raises(ValueError, match="min_doc"):
        SyntheticCorpus(64, 1, 4)
    with pytest.raises(ValueError, match="max_docs"):
        SyntheticCorpus(64, 8, 8).batch(1, 64, 4)


def test_presets() -> None:
    total, active = PRESETS["dense-1b"].model.param_count()
    assert 0.95e9 < total == active < 1.1e9
    total, active = PRESETS["moe-2b"].model.param_count()
    assert 1.9e9 < total < 2.2e9 and 0.4e9 < active < 0.6e9
    for name in ("dense-1b", "moe-2b"):
        p = PRESETS[name]
        assert p.run.seq_len == 8192 and p.model.dtype == "bfloat16"
        assert [p.model.window(i) for i in range(4)] == [1024, None, 1024, None]  # gpt-oss: alternating
    assert get_preset("tiny", dtype="bfloat16", batch=2).run.batch == 2
    with pytest.raises(ValueError, match="unknown overrides"):
        get_preset("tiny", colour="red")
    with pytest.raises(ValueError, match="preset 'huge' is unknown"):
        get_preset("huge")
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        ModelConfig(vocab=8, d_model=8, n_layers=1, n_heads=3, n_kv_heads=2, head_dim=4, d_ff=8)
