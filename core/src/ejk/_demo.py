"""``ejk demo``: the main job, end to end, on whatever device JAX has (the CPU by default).

Loads the plugins, runs ``ejk.flash_attention`` through an Executor that autotunes,
persists the winner, runs again with a fresh Executor that finds it on disk, checks the
result against the reference and shows what was chosen and why.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from rich.table import Table

from ejk._console import console as make_console

SIZES = {  # batch, q/kv length, q heads, kv heads, head dim
    "tiny": (1, 128, 4, 2, 32),
    "small": (1, 1024, 8, 2, 64),
    "large": (2, 4096, 16, 4, 128),
}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="run flash attention through the Executor: autotune, persist, reuse")
    p.add_argument("--size", choices=sorted(SIZES), default="small", help="problem size (default: small)")
    p.add_argument("--platform", default="auto", help="platform to use (default: auto = compare all available)")
    p.add_argument("--cache-dir", help="persistent cache directory (default: EJK_CACHE_DIR or the user cache dir)")
    p.add_argument("--fresh", action="store_true", help="forget this demo's cached choice first, to tune again")
    p.set_defaults(func=run)


def _events_table(events: list[Any]) -> Table:
    table = Table(title="why: the selection chain's decisions")
    for column in ("step", "tier", "config", "detail"):
        table.add_column(column)
    for i, event in enumerate(events, 1):
        table.add_row(str(i), event.tier, str(event.cfg), event.detail)
    return table


def _trials_table(event: Any) -> Table:
    table = Table(title="autotuning: median time of each compiled candidate")
    for column in ("candidate", "median", "status"):
        table.add_column(column)
    best = event.cfg
    for trial in sorted(event.tune.trials, key=lambda t: t.seconds if t.seconds is not None else float("inf")):
        median = f"{trial.seconds * 1e3:.3f} ms" if trial.seconds is not None else "-"
        status = "[green]chosen[/green]" if trial.cfg == best else (trial.error or "")
        table.add_row(str(trial.cfg), median, status)
    return table


def run(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import ejk
    from ejk import environment
    from ejk.ops._base import resolve_platform
    from ejk.ops._flash_attention._op import KERNEL as FLASH_KERNEL
    from ejk.ops._flash_attention._op import flash_attention_call
    from ejk.testing import reference_flash_attention

    console = make_console()
    cache_dir = os.path.expanduser(args.cache_dir) if args.cache_dir else environment.cache_dir()
    host = ejk.get_plugin_host()
    usable = sorted(p for p, s in host.platform_statuses().items() if s.available)
    console.print(f"[bold]ejk {ejk.__version__}[/bold] on {jax.default_backend()} ({jax.devices()[0].device_kind}); "
                  f"plugins: {', '.join(sorted(host.plugins)) or 'none'}; usable platforms: {', '.join(usable)}")

    batch, seq, heads, kv_heads, dim = SIZES[args.size]
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (batch, seq, heads, dim), jnp.float32)
    k = jax.random.normal(keys[1], (batch, seq, kv_heads, dim), jnp.float32)
    v = jax.random.normal(keys[2], (batch, seq, kv_heads, dim), jnp.float32)
    console.print(f"flash_attention q{list(q.shape)} k{list(k.shape)} v{list(v.shape)} float32, causal, GQA "
                  f"{heads // kv_heads}:1")

    def executor(events: list[Any]) -> ejk.Executor[Any, Any]:
        policy = ejk.AutotunePolicy(autotune=True, repeats=5)
        chain: ejk.ConfigSelectorChain[Any] = ejk.ConfigSelectorChain(
            policy=policy, on_event=events.append, persistent_dir=cache_dir
        )
        return ejk.Executor(chain)

    first_events: list[Any] = []
    first = executor(first_events)
    if args.fresh:
        arrays, static = flash_attention_call(q, k, v, causal=True)
        inv = first.invocation(FLASH_KERNEL, arrays, {**static, "platform": resolve_platform(args.platform)})
        cache = first.chooser.persistent_cache(FLASH_KERNEL)  # type: ignore[attr-defined]
        if cache is not None and cache.remove(*inv.cache_key):
            console.print("--fresh: removed the cached choice for this call")

    with ejk.use_executor(first):
        start = time.perf_counter()
        out = jax.block_until_ready(ejk.flash_attention(q, k, v, causal=True, platform=args.platform))
        first_s = time.perf_counter() - start
    console.print(f"\n[bold]run 1[/bold] (new process state, {first_s:.2f}s including selection and compilation)")
    console.print(_events_table(first_events))
    tuned = [e for e in first_events if e.tier == "autotune"]
    if tuned:
        console.print(_trials_table(tuned[0]))
    elif first_events and first_events[-1].tier == "persistent":
        console.print("(tuned by an earlier run and read from disk; pass --fresh to tune again)")

    second_events: list[Any] = []
    with ejk.use_executor(executor(second_events)):
        start = time.perf_counter()
        out2 = jax.block_until_ready(ejk.flash_attention(q, k, v, causal=True, platform=args.platform))
        second_s = time.perf_counter() - start
    console.print(f"\n[bold]run 2[/bold] (a fresh Executor with an empty memory cache, {second_s:.2f}s)")
    console.print(_events_table(second_events))

    reference = reference_flash_attention(q, k, v, causal=True)
    error = float(np.max(np.abs(np.asarray(out) - np.asarray(reference))))
    same = bool(np.array_equal(np.asarray(out), np.asarray(out2)))
    chosen = second_events[-1].cfg if second_events else None
    console.print(f"\nchosen: [bold]{chosen}[/bold]")
    console.print(f"max |out - reference| = {error:.2e}; run 1 and run 2 agree: {same}")
    console.print(f"cache: {os.path.join(cache_dir, 'flash_attention.json')} (see `ejk cache show`)")
    ok = error < 1e-4 and same and bool(second_events) and second_events[-1].tier in ("persistent", "memory")
    if not ok:
        console.print("[red]demo check failed[/red]")
    return 0 if ok else 1
