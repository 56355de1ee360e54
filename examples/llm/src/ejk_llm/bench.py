"""Training and generation throughput, ejk against the plain-JAX switch, in one run.

    python examples/llm/bench.py --preset tiny                          # CPU: runs, numbers mean little
    python examples/llm/bench.py --preset dense-1b --out results.json   # one GPU
    python examples/llm/bench.py --preset dense-1b --mesh fsdp=4 --batch 8   # four GPUs, 2 rows each

Both backends start from the same parameters and see the same batches, so their loss curves are
comparable step for step. Training: tokens per second of the timed steps (after ``--warmup`` steps
that compile). Generation: new tokens per second of a second batched generation (the first compiles),
prefill included — paged cache with chunked prefill on ejk, the dense-cache loop on plain JAX.
Prints a table with the device and versions and writes it all as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import os
import platform
import time
from typing import Any

import jax
import numpy as np

from ejk_llm import sharding
from ejk_llm.backends import BACKENDS, Backend
from ejk_llm.config import PRESETS, Preset
from ejk_llm.data import prompts
from ejk_llm.generate import make_engine
from ejk_llm.train import Trainer, preset_from_args

__all__ = ["bench_generation", "bench_training", "main", "versions"]

_DISTRIBUTIONS = ("jax", "jaxlib", "optax", "ejk-core", "ejk-xla", "ejk-pallas", "ejk-triton", "ejk-cute",
                  "jax-triton", "triton", "nvidia-cutlass-dsl")


def versions() -> dict[str, str]:
    """Versions of the installed distributions that matter here."""
    found = {}
    for name in _DISTRIBUTIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def bench_training(preset: Preset, backend: Backend, mesh: Any, warmup: int, steps: int,
                   seed: int) -> dict[str, Any]:
    trainer = Trainer(preset.model, preset.run, backend, mesh, steps=warmup + steps, seed=seed)
    batches = trainer.batches()
    losses = []
    start = time.perf_counter()
    for _ in range(warmup):
        losses.append(float(trainer.step(next(batches))["ce"]))
    compile_s = time.perf_counter() - start
    data = [next(batches) for _ in range(steps)]  # made before the clock starts
    jax.block_until_ready(data)
    metrics = []
    start = time.perf_counter()
    for batch in data:
        metrics.append(trainer.step(batch))
    jax.block_until_ready(metrics)
    seconds = time.perf_counter() - start
    losses += [float(m["ce"]) for m in metrics]
    tokens = preset.run.batch * preset.run.seq_len * steps
    return {"tokens_per_s": tokens / seconds, "step_ms": 1e3 * seconds / steps, "warmup_s": compile_s,
            "losses": losses}


def bench_generation(preset: Preset, backend: Backend, new_tokens: int, seed: int) -> dict[str, Any]:
    from ejk_llm.model import init_params

    cfg, run = preset.model, preset.run
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(seed))
    requests = prompts(cfg.vocab, run.prompt_lens, seed=seed + 7)
    engine = make_engine(cfg, run, params, backend, new_tokens, len(requests))
    first = engine.generate(requests, new_tokens)  # compiles
    result = engine.generate(requests, new_tokens)
    total = new_tokens * len(requests)
    return {"tokens_per_s": total / result.seconds, "seconds": result.seconds, "model_calls": result.steps,
            "first_call_s": first.seconds, "requests": len(requests), "prompt_lens": list(run.prompt_lens),
            "new_tokens": new_tokens, "tokens": [t.tolist() for t in result.tokens]}


def _release_device_memory() -> None:
    """Drop the last run's buffers and compiled programs, so the next backend has the whole device."""
    gc.collect()
    jax.clear_caches()


def _summarise(results: dict[str, Any]) -> None:
    """Print ejk against plain JAX where both ran, and the loss-curve difference."""
    train, gen = results["train"], results["generate"]
    rows = [(f"{part} tokens/s", found["ejk"]["tokens_per_s"], found["plain"]["tokens_per_s"])
            for part, found in (("train", train), ("generate", gen)) if set(BACKENDS) <= set(found)]
    notes = []
    if set(BACKENDS) <= set(train):
        ejk_curve, plain_curve = (np.array(train[n]["losses"]) for n in BACKENDS)
        train["max_loss_difference"] = float(np.max(np.abs(ejk_curve - plain_curve)))
        notes.append(f"loss curves: max |ejk - plain| over {len(ejk_curve)} steps = {train['max_loss_difference']:.2e}")
    if set(BACKENDS) <= set(gen):
        gen["same_tokens"] = gen["ejk"]["tokens"] == gen["plain"]["tokens"]
        notes.append(f"greedy tokens identical: {gen['same_tokens']}")
    if rows:
        print(_table(rows))
    if notes:
        print("; ".join(notes))


def _table(rows: list[tuple[str, float, float]]) -> str:
    lines = [f"{'':24} {'ejk':>14} {'plain JAX':>14} {'ejk / plain':>12}"]
    for name, a, b in rows:
        lines.append(f"{name:24} {a:14,.0f} {b:14,.0f} {a / b:11.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--mesh", default="", help="mesh axes for training, e.g. fsdp=4 (generation: one device)")
    parser.add_argument("--dtype", default=None, help="compute dtype override")
    parser.add_argument("--batch", type=int, default=None,
                        help="training rows per step (default: the preset's; with --mesh, a multiple of the devices)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=2, help="untimed training steps (compilation)")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per request")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated backends to run (the loss-curve comparison needs both)")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-generation", action="store_true")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    preset = preset_from_args(args, **({"batch": args.batch} if args.batch else {}))
    mesh = sharding.make_mesh(sharding.parse_mesh(args.mesh))
    device = jax.devices()[0]
    header = {
        "preset": args.preset, "dtype": preset.model.dtype, "mesh": dict(mesh.shape) if mesh else {},
        "device": device.device_kind, "devices": jax.device_count(), "platform": device.platform,
        "host": platform.platform(), "versions": versions(),
        "params": dict(zip(("total", "active"), preset.model.param_count(), strict=True)),
        "batch": [preset.run.batch, preset.run.seq_len],
    }
    print(" ".join(f"{k}={v}" for k, v in header.items()), flush=True)
    backends = [name for name in args.backends.split(",") if name]
    if not backends or any(name not in BACKENDS for name in backends):
        parser.error(f"--backends takes names among {', '.join(BACKENDS)}, got {args.backends!r}")
    results: dict[str, Any] = {"header": header, "train": {}, "generate": {}}
    for part, skip in (("train", args.skip_training), ("generate", args.skip_generation)):
        for name in [] if skip else backends:
            if part == "train":
                found = bench_training(preset, Backend(name), mesh, args.warmup, args.steps, args.seed)
                detail = f"step {found['step_ms']:.1f} ms, warm-up {found['warmup_s']:.0f} s"
            else:
                found = bench_generation(preset, Backend(name), args.tokens, args.seed)
                detail = f"{found['model_calls']} model calls in {found['seconds']:.2f} s"
            results[part][name] = found
            print(f"{part} {name}: {found['tokens_per_s']:,.0f} tok/s ({detail})", flush=True)
            _release_device_memory()
    _summarise(results)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
