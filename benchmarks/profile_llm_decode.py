"""Where one decode step of ``examples/llm``'s generation engines spends its time on a GPU.

For the paged engine (ejk) and the dense-cache loop (plain JAX) of a preset: the wall time of a decode
step called back to back (queued, as the engines run, and waiting for each step's tokens), the GPU's
busy time in it, and the kernels that take the most GPU time.

    python benchmarks/profile_llm_decode.py --preset dense-1b
    python benchmarks/profile_llm_decode.py --preset moe-2b --requests 32 --context 4096
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "llm" / "src"))

import jax
import jax.numpy as jnp
import numpy as np

from ejk.bench import trace_gpu_events
from ejk_llm.backends import Backend
from ejk_llm.config import PRESETS
from ejk_llm.generate import DenseEngine, PagedEngine
from ejk_llm.model import inference_params, init_params


def _decode_args(engine: Any, context: int) -> tuple[Any, ...]:
    """The inputs of a decode step with every request at ``context`` tokens."""
    s = engine.max_seqs
    if isinstance(engine, PagedEngine):
        table = np.arange(engine.num_pages, dtype=np.int32).reshape(s, engine.pages_per_seq)
        return (jnp.zeros(s, jnp.int32), np.zeros(s, np.int32), np.ones(s, bool), np.full(s, context, np.int32),
                np.arange(s, dtype=np.int32),
                np.arange(s + 1, dtype=np.int32), np.full(s, context + 1, np.int32), table)
    return (np.zeros((s, 1), np.int32), np.full((s, 1), context, np.int32), np.ones((s, 1), bool),
            np.zeros(s, np.int32))


def profile(engine: Any, context: int, steps: int) -> dict[str, Any]:
    args = _decode_args(engine, context)
    cache = engine.empty_cache() if isinstance(engine, PagedEngine) else _dense_cache(engine)
    for _ in range(3):  # compile and warm
        nxt, cache = engine._step(engine.params, cache, *args)
        np.asarray(nxt)
    start = time.perf_counter()
    for _ in range(steps):
        nxt, cache = engine._step(engine.params, cache, *args)
        np.asarray(nxt)
    sync_ms = 1e3 * (time.perf_counter() - start) / steps
    start = time.perf_counter()
    for _ in range(steps):
        nxt, cache = engine._step(engine.params, cache, *args)
    np.asarray(nxt)
    wall_ms = 1e3 * (time.perf_counter() - start) / steps
    state = {"cache": cache}

    def step() -> Any:
        out, state["cache"] = engine._step(engine.params, state["cache"], *args)
        return np.asarray(out)

    events = trace_gpu_events(step, steps) or []
    busy = collections.Counter()
    for name, begin, end in events:
        busy[name] += end - begin
    total = sum(busy.values())
    return {"wall_ms": wall_ms, "sync_ms": sync_ms, "gpu_busy_ms": total / 1e6 / steps,
            "kernels_per_step": len(events) / steps,
            "top": [(name, ns / 1e6 / steps) for name, ns in busy.most_common(15)]}


def _dense_cache(engine: DenseEngine) -> Any:
    c = engine.cfg
    shape = (engine.max_seqs, engine.max_len, c.n_kv_heads, c.head_dim)
    return (tuple(jnp.zeros(shape, c.compute_dtype) for _ in range(c.n_layers)),
            tuple(jnp.zeros(shape, c.compute_dtype) for _ in range(c.n_layers)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--requests", type=int, default=None, help="requests decoding together (default: preset's)")
    parser.add_argument("--context", type=int, default=None, help="tokens in each request's cache")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    cfg, run = preset.model, preset.run
    requests = args.requests or len(run.prompt_lens)
    context = args.context or max(run.prompt_lens)
    params = inference_params(cfg, jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0)))
    max_len = context + 64
    engines = {"ejk paged": PagedEngine(cfg, params, max_seqs=requests, max_len=max_len, page_size=run.page_size,
                                        prefill_chunk=run.prefill_chunk),
               "plain dense": DenseEngine(cfg, params, max_seqs=requests, max_len=max_len, backend=Backend("plain"))}
    print(f"{args.preset}: {requests} requests at {context} tokens, {jax.devices()[0].device_kind}")
    for name, engine in engines.items():
        found = profile(engine, context, args.steps)
        print(f"\n{name}: wall {found['wall_ms']:.3f} ms/step queued ({found['sync_ms']:.3f} waiting on each), "
              f"GPU busy {found['gpu_busy_ms']:.3f} ms/step, "
              f"{found['kernels_per_step']:.0f} kernels/step")
        for kernel, ms in found["top"]:
            print(f"  {ms:8.3f} ms  {kernel[:110]}")


if __name__ == "__main__":
    main()
