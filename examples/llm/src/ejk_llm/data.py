"""Synthetic documents with learnable structure, packed into rows of a fixed length.

Nothing is downloaded. A document starts with the BOS token 0 and then follows a fixed sparse Markov
chain (each token has four likely successors), with spans copied from earlier in the same document
(so attention over the context pays off). A model that learns the chain and the copies gets far
below the uniform ``log(vocab)`` loss.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["BOS", "Batch", "SyntheticCorpus", "cu_seqlens_of", "prompts"]

BOS = 0
IGNORE = -100


@dataclasses.dataclass(frozen=True)
class Batch:
    """``tokens``, ``positions``, ``segments``, ``labels`` ``[B, T]`` int32 and ``cu_seqlens`` ``[B, N+1]`` int32.

    Row ``b``'s document ``s`` is tokens ``cu_seqlens[b, s]:cu_seqlens[b, s+1]``; unused entries are
    ``T`` (empty documents). ``positions`` restart at 0 with each document, ``segments`` number the
    documents of a row (``s``); ``labels`` are the next token of the same document, ``-100`` (ignored)
    on each document's last token.
    """

    tokens: np.ndarray
    positions: np.ndarray
    segments: np.ndarray
    labels: np.ndarray
    cu_seqlens: np.ndarray


class SyntheticCorpus:
    """An endless stream of documents of ``min_doc..max_doc`` tokens over ``vocab`` tokens."""

    def __init__(self, vocab: int, min_doc: int, max_doc: int, seed: int = 0) -> None:
        if vocab < 8:
            raise ValueError(f"vocab ({vocab}) must be at least 8")
        if not 2 <= min_doc <= max_doc:
            raise ValueError(f"document lengths need 2 <= min_doc ({min_doc}) <= max_doc ({max_doc})")
        self.vocab, self.min_doc, self.max_doc = vocab, min_doc, max_doc
        chain = np.random.default_rng(1234)  # the language itself is fixed; `seed` picks the documents
        self.successors = chain.integers(1, vocab, size=(vocab, 4))
        self.probs = np.array([0.55, 0.25, 0.15, 0.05])
        self.rng = np.random.default_rng(seed)

    def document(self) -> np.ndarray:
        n = int(self.rng.integers(self.min_doc, self.max_doc + 1))
        doc = np.empty(n, np.int32)
        doc[0] = BOS
        doc[1] = self.rng.integers(1, self.vocab)
        # Every random draw up front (one numpy call each), then one cheap pass over the tokens.
        picks = self.rng.choice(4, size=n, p=self.probs)
        copy = self.rng.random(n) < 0.1
        spans = self.rng.integers(4, 9, size=n)
        starts = self.rng.random(n)
        i = 2
        while i < n:
            if i >= 8 and copy[i]:  # copy a span of 4-8 earlier tokens
                start = 1 + int(starts[i] * (i - 4))
                take = min(int(spans[i]), n - i, i - start)
                doc[i:i + take] = doc[start:start + take]
                i += take
                continue
            doc[i] = self.successors[doc[i - 1], picks[i]]
            i += 1
        return doc

    def batch(self, rows: int, seq_len: int, max_docs: int) -> Batch:
        """``rows`` rows of ``seq_len`` tokens, each filled with whole documents and a cut last one.

        ``max_docs`` (the offsets' static length less one) must be at least ``ceil(seq_len / min_doc)``.
        """
        if max_docs < -(-seq_len // self.min_doc):
            raise ValueError(f"max_docs ({max_docs}) must be at least ceil(seq_len / min_doc)")
        tokens = np.zeros((rows, seq_len), np.int32)
        positions = np.zeros((rows, seq_len), np.int32)
        segments = np.zeros((rows, seq_len), np.int32)
        labels = np.full((rows, seq_len), IGNORE, np.int32)
        cu = np.full((rows, max_docs + 1), seq_len, np.int32)
        for b in range(rows):
            t, s = 0, 0
            cu[b, 0] = 0
            while t < seq_len:
                doc = self.document()[: seq_len - t]  # at most ceil(T / min_doc) < max_docs documents
                n = len(doc)
                tokens[b, t:t + n] = doc
                positions[b, t:t + n] = np.arange(n)
                segments[b, t:t + n] = s
                labels[b, t:t + n - 1] = doc[1:]
                t, s = t + n, s + 1
                cu[b, s] = t
        return Batch(tokens, positions, segments, labels, cu)


def cu_seqlens_of(positions: np.ndarray) -> np.ndarray:
    """``[N+1]`` offsets of a packed 1-D token stream whose positions restart at 0 with each sequence."""
    starts = np.flatnonzero(np.asarray(positions) == 0)
    return np.concatenate([starts, [len(positions)]]).astype(np.int32)


def prompts(vocab: int, lengths: tuple[int, ...], seed: int = 7) -> list[np.ndarray]:
    """Prompts of the given lengths, each the start of a synthetic document."""
    corpus = SyntheticCorpus(vocab, max(lengths) + 1, max(lengths) + 1, seed=seed)
    return [corpus.document()[:n] for n in lengths]
