"""Batched greedy generation: a paged KV cache on ejk, a dense-cache loop on plain JAX.

    python examples/llm/generate.py --preset tiny --tokens 32
    python examples/llm/generate.py --preset tiny --tokens 32 --backend plain   # the dense-cache loop

``PagedEngine`` (ejk) keeps each layer's keys and values in pages (``[P, page, Hkv, D]``) handed out
from a shuffled free list; every step packs what each request needs into one ragged token stream — the
next chunk of its prompt (chunked prefill) or its one new token (decode) — writes the stream's keys and
values into the pages and attends through ``ejk.ragged_paged_attention``. Requests that finished their
prompt decode while others still prefill. ``DenseEngine`` (plain) is the usual loop: a ``[S, max_len]``
cache per layer, the prompts in one padded call, then one token per request per step, masked
``jax.nn.dot_product_attention`` over the whole cache. Both feed each step's new tokens to the next step on
the device, so the host queues steps without waiting for them; the tokens are read once at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ejk
from ejk_llm import sharding
from ejk_llm.backends import Backend, masked_attention
from ejk_llm.config import ModelConfig, RunConfig
from ejk_llm.data import prompts
from ejk_llm.model import Params, decoder, inference_params, init_params, lm_head

__all__ = ["DenseEngine", "GenerationResult", "PagedEngine", "main"]


@dataclasses.dataclass
class GenerationResult:
    tokens: list[np.ndarray]  # the new tokens of each request
    steps: int  # model calls
    seconds: float  # wall time of the whole generation (compilation included on a first call)


def _last_token_logits(cfg: ModelConfig, params: Params, h: jax.Array, rows: jax.Array) -> jax.Array:
    return jnp.einsum("sd,dv->sv", h[rows], lm_head(cfg, params), preferred_element_type=jnp.float32)


class PagedEngine:
    """Greedy generation over a paged KV cache (ejk's ``ragged_paged_attention``)."""

    def __init__(self, cfg: ModelConfig, params: Params, *, max_seqs: int, max_len: int, page_size: int,
                 prefill_chunk: int, seed: int = 0) -> None:
        self.cfg, self.params = cfg, params
        self.max_seqs, self.page_size, self.chunk = max_seqs, page_size, prefill_chunk
        self.pages_per_seq = -(-max_len // page_size)
        self.num_pages = max_seqs * self.pages_per_seq
        self.rng = np.random.default_rng(seed)
        self.backend = Backend("ejk")
        self._step = jax.jit(self._forward, donate_argnums=(1,))

    def empty_cache(self) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
        c = self.cfg
        shape = (self.num_pages, self.page_size, c.n_kv_heads, c.head_dim)
        zeros = tuple(jnp.zeros(shape, c.compute_dtype) for _ in range(c.n_layers))
        return zeros, tuple(jnp.zeros(shape, c.compute_dtype) for _ in range(c.n_layers))

    def _forward(self, params: Params, cache: Any, previous: jax.Array, tokens: jax.Array, use_previous: jax.Array,
                 positions: jax.Array, seq_ids: jax.Array, cu_q_lens: jax.Array, kv_lens: jax.Array,
                 page_indices: jax.Array) -> tuple[jax.Array, Any]:
        """One packed step: ``tokens``, ``positions``, ``seq_ids [T]`` (``-1`` for padding rows), ``cu_q_lens
        [S+1]``, ``kv_lens [S]`` (after the step); rows where ``use_previous [T]`` take their request's token
        from ``previous [S]`` (the last step's output, still on the device) instead of ``tokens``. Returns each
        request's next token ``[S]`` and the cache."""
        cfg, page = self.cfg, self.page_size
        live = seq_ids >= 0
        tokens = jnp.where(use_previous, previous[jnp.maximum(seq_ids, 0)], tokens)
        slot_page = jnp.where(live, page_indices[jnp.maximum(seq_ids, 0), positions // page], self.num_pages)
        slot = positions % page

        def attend(layer: int, q: jax.Array, k: jax.Array, v: jax.Array, sinks: jax.Array | None,
                   state: Any) -> tuple[jax.Array, Any]:
            ks, vs = state
            kp = ks[layer].at[slot_page, slot].set(k, mode="drop")  # padding rows write nowhere
            vp = vs[layer].at[slot_page, slot].set(v, mode="drop")
            window = cfg.window(layer)
            out = ejk.ragged_paged_attention(
                q, kp, vp, kv_lens, page_indices, cu_q_lens, jnp.int32(self.max_seqs),
                sliding_window=None if window is None else window - 1, sinks=sinks)
            return out, ((*ks[:layer], kp, *ks[layer + 1:]), (*vs[:layer], vp, *vs[layer + 1:]))

        h, cache, _ = decoder(cfg, self.backend, params, tokens, positions, attend, cache)
        last = jnp.maximum(cu_q_lens[1:] - 1, 0)
        return jnp.argmax(_last_token_logits(cfg, params, h, last), axis=-1).astype(jnp.int32), cache

    def generate(self, requests: list[np.ndarray], new_tokens: int) -> GenerationResult:
        """``new_tokens`` greedy tokens after each prompt (at most ``max_seqs`` prompts of >= 1 token)."""
        n = len(requests)
        if not 0 < n <= self.max_seqs:
            raise ValueError(f"{n} requests but the engine holds 1 to {self.max_seqs}")
        if any(len(r) + new_tokens > self.pages_per_seq * self.page_size for r in requests):
            raise ValueError("a request's prompt + new tokens exceed the engine's max_len")
        if any(len(r) == 0 for r in requests):
            raise ValueError("every prompt needs at least one token")
        free = self.rng.permutation(self.num_pages)  # pages come from anywhere in the pool
        table = free.reshape(self.max_seqs, self.pages_per_seq).astype(np.int32)
        done = [0] * n  # tokens of each request already in the cache
        emitted = [0] * n  # new tokens of each request so far
        # The host never waits for a step's tokens: a decoding request's input is the previous step's output,
        # picked on the device, so steps queue up back to back; the tokens are read once at the end.
        outputs: list[tuple[jax.Array, list[int]]] = []  # per step: its next tokens and who emitted one
        cache = self.empty_cache()
        start = time.perf_counter()
        nxt = jnp.zeros(self.max_seqs, jnp.int32)
        while any(e < new_tokens for e in emitted):
            chunks: list[np.ndarray | None] = []  # None: the request's one new token, from the last step
            for s, prompt in enumerate(requests):
                if done[s] < len(prompt):
                    chunks.append(np.asarray(prompt[done[s]:done[s] + self.chunk]))
                elif emitted[s] < new_tokens:
                    chunks.append(None)
                else:
                    chunks.append(np.zeros(0, np.int32))
            prefill = any(c is not None and len(c) > 1 for c in chunks)
            width = self.max_seqs * (self.chunk if prefill else 1)  # two buckets: two compiled programs
            tokens = np.zeros(width, np.int32)
            use_previous = np.zeros(width, bool)
            positions = np.zeros(width, np.int32)
            seq_ids = np.full(width, -1, np.int32)
            cu = np.zeros(self.max_seqs + 1, np.int32)
            kv_lens = np.zeros(self.max_seqs, np.int32)
            for s, c in enumerate(chunks):
                t0, length = cu[s], 1 if c is None else len(c)
                if c is None:
                    use_previous[t0] = True
                else:
                    tokens[t0:t0 + length] = c
                positions[t0:t0 + length] = done[s] + np.arange(length)
                seq_ids[t0:t0 + length] = s
                cu[s + 1] = t0 + length
                kv_lens[s] = done[s] + length
            cu[n + 1:] = cu[n]
            nxt, cache = self._step(self.params, cache, nxt, tokens, use_previous, positions, seq_ids, cu, kv_lens,
                                    table)
            emitters = []
            for s, c in enumerate(chunks):
                length = 1 if c is None else len(c)
                done[s] += length
                if length and done[s] >= len(requests[s]):  # this step ended the prompt or decoded
                    emitters.append(s)
                    emitted[s] += 1
            outputs.append((nxt, emitters))
        out: list[list[int]] = [[] for _ in range(n)]
        for step_tokens, emitters in zip(jax.device_get([o[0] for o in outputs]), (o[1] for o in outputs),
                                         strict=True):
            for s in emitters:
                out[s].append(int(step_tokens[s]))
        return GenerationResult([np.array(o[:new_tokens], np.int32) for o in out], len(outputs),
                                time.perf_counter() - start)


class DenseEngine:
    """Greedy generation with a dense ``[S, max_len]`` KV cache per layer, on any backend's other ops
    (plain JAX attention over the whole cache)."""

    def __init__(self, cfg: ModelConfig, params: Params, *, max_seqs: int, max_len: int,
                 backend: Backend | None = None) -> None:
        self.cfg, self.params, self.max_seqs, self.max_len = cfg, params, max_seqs, max_len
        self.backend = backend or Backend("plain")
        self._step = jax.jit(self._forward, donate_argnums=(1,))

    def _forward(self, params: Params, cache: Any, tokens: jax.Array, positions: jax.Array, valid: jax.Array,
                 last: jax.Array) -> tuple[jax.Array, Any]:
        """``tokens, positions, valid [S, Tq]``; ``last [S]``: the row of each request's last valid token."""
        cfg, s, t = self.cfg, tokens.shape[0], tokens.shape[1]
        write = jnp.where(valid, positions, self.max_len)
        rows = jnp.arange(s)[:, None]
        key_pos = jnp.arange(self.max_len)

        def attend(layer: int, q: jax.Array, k: jax.Array, v: jax.Array, sinks: jax.Array | None,
                   state: Any) -> tuple[jax.Array, Any]:
            ks, vs = state
            kc = ks[layer].at[rows, write].set(k, mode="drop")
            vc = vs[layer].at[rows, write].set(v, mode="drop")
            mask = (key_pos[None, None, :] <= positions[:, :, None]) & valid[:, :, None]
            window = cfg.window(layer)
            if window is not None:
                mask &= positions[:, :, None] - key_pos[None, None, :] < window
            out = masked_attention(q, kc, vc, mask, sinks)
            return out, ((*ks[:layer], kc, *ks[layer + 1:]), (*vs[:layer], vc, *vs[layer + 1:]))

        h, cache, _ = decoder(cfg, self.backend, params, tokens, positions, attend, cache)
        logits = _last_token_logits(cfg, params, h.reshape(s * t, -1), jnp.arange(s) * t + last)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), cache

    def generate(self, requests: list[np.ndarray], new_tokens: int) -> GenerationResult:
        c, n = self.cfg, len(requests)
        if not 0 < n <= self.max_seqs or any(len(r) + new_tokens > self.max_len for r in requests):
            raise ValueError(f"1 to {self.max_seqs} requests of prompt + new tokens <= {self.max_len}")
        shape = (self.max_seqs, self.max_len, c.n_kv_heads, c.head_dim)
        cache = (tuple(jnp.zeros(shape, c.compute_dtype) for _ in range(c.n_layers)),
                 tuple(jnp.zeros(shape, c.compute_dtype) for _ in range(c.n_layers)))
        width = max(len(r) for r in requests)
        tokens = np.zeros((self.max_seqs, width), np.int32)
        valid = np.zeros((self.max_seqs, width), bool)
        for s, r in enumerate(requests):
            tokens[s, :len(r)] = r
            valid[s, :len(r)] = True
        lens = np.array([len(r) for r in requests] + [1] * (self.max_seqs - n), np.int32)
        positions = np.broadcast_to(np.arange(width, dtype=np.int32), tokens.shape)
        start = time.perf_counter()
        nxt, cache = self._step(self.params, cache, tokens, positions, valid, lens - 1)
        out = [nxt]
        live = (np.arange(self.max_seqs) < n)[:, None]
        for i in range(new_tokens - 1):  # each step's input stays on the device: no wait on the host
            nxt, cache = self._step(self.params, cache, nxt[:, None], (lens + i)[:, None], live,
                                    np.zeros(self.max_seqs, np.int32))
            out.append(nxt)
        gen = np.stack(jax.device_get(out), axis=1)
        return GenerationResult([gen[s] for s in range(n)], new_tokens, time.perf_counter() - start)


def make_engine(cfg: ModelConfig, run: RunConfig, params: Params, backend: Backend, new_tokens: int,
                n_requests: int) -> PagedEngine | DenseEngine:
    max_len = max(run.prompt_lens) + new_tokens
    params = inference_params(cfg, params)
    if backend.is_ejk:
        return PagedEngine(cfg, params, max_seqs=n_requests, max_len=max_len, page_size=run.page_size,
                           prefill_chunk=run.prefill_chunk)
    return DenseEngine(cfg, params, max_seqs=n_requests, max_len=max_len, backend=backend)


def main(argv: list[str] | None = None) -> None:
    from ejk_llm.train import add_common_args, preset_from_args

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per request")
    parser.add_argument("--train-steps", type=int, default=0,
                        help="train this many steps first (the same backend), so the model has something to say")
    args = parser.parse_args(argv)
    preset = preset_from_args(args)
    cfg, run = preset.model, preset.run
    backend = Backend(args.backend)
    sizes = sharding.parse_mesh(args.mesh)
    if "seq" in sizes:
        raise ValueError("--mesh seq=... splits training rows over a ring; generation splits no sequence: "
                         "drop the seq axis")
    mesh = sharding.make_mesh(sizes)
    context = contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)
    with context:
        if args.train_steps:
            from ejk_llm.train import Trainer

            trainer = Trainer(cfg, run, backend, mesh, steps=args.train_steps, seed=args.seed)
            batches = trainer.batches()
            for _ in range(args.train_steps):
                trainer.step(next(batches))
            params = trainer.params
        else:
            shapes = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(args.seed))
            params = jax.jit(functools.partial(init_params, cfg),
                             out_shardings=sharding.param_shardings(shapes, mesh))(jax.random.key(args.seed))
        requests = prompts(cfg.vocab, run.prompt_lens, seed=args.seed + 7)
        engine = make_engine(cfg, run, params, backend, args.tokens, len(requests))
        result = engine.generate(requests, args.tokens)
    kind = "paged KV cache (ejk.ragged_paged_attention)" if backend.is_ejk else "dense KV cache (plain JAX)"
    print(f"preset {args.preset}: {len(requests)} requests, prompts of {list(run.prompt_lens)} tokens, "
          f"{args.tokens} new tokens each, {kind}: {result.steps} steps in {result.seconds:.2f} s (incl. compile)")
    for s, (prompt, new) in enumerate(zip(requests, result.tokens, strict=True)):
        print(f"request {s}: prompt {prompt.tolist()} -> {new.tolist()}")


if __name__ == "__main__":
    main()
