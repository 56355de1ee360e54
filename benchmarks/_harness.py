"""Shared pieces of the benchmark scripts that `ejk bench` does not cover (ring attention, sharded MoE,
the example plugin): options, timing, header, where results go."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

WARMUP = 2


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every benchmark takes: ``--smoke``, ``--reps``, ``--out``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes and configs (CPU is fine)")
    p.add_argument("--reps", type=int, default=None, help="timed calls per line (default 10, smoke 2)")
    p.add_argument("--out", default=None, help="markdown file to write (default: $OUT/<name> or results/)")
    return p


def parse(p: argparse.ArgumentParser) -> argparse.Namespace:
    args = p.parse_args()
    args.reps = args.reps or (2 if args.smoke else 10)
    return args


def time_ms(fn: Callable[..., Any], args: tuple[Any, ...], reps: int, *, min_sample_s: float = 0.02) -> float:
    """Median milliseconds per call of the compiled ``fn`` after warm-up (compilation is never timed).

    Each of the ``reps`` samples times a loop of back-to-back calls lasting at least
    ``min_sample_s`` and blocks only at its end, so host dispatch overlaps the device work
    instead of adding to it.
    """
    compiled = jax.jit(fn).lower(*args).compile()
    start = time.perf_counter()
    for _ in range(WARMUP):
        jax.block_until_ready(compiled(*args))
    per_call = max((time.perf_counter() - start) / WARMUP, 1e-6)
    calls = max(1, min(1000, int(min_sample_s / per_call) + 1))
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        out = None
        for _ in range(calls):
            out = compiled(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples) * 1e3


def error_text(exc: BaseException) -> str:
    """One short line naming a failure (for a table cell)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{type(exc).__name__}: {first[:140]}"


def version(*dists: str) -> str:
    """The installed version of the first of ``dists`` that is installed."""
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return "?"


def header(title: str, args: argparse.Namespace, *notes: str, case: str = "case", rate: str = "rate") -> list[str]:
    """Title, date, device and versions, method notes, then the table head."""
    device = jax.devices()[0]
    return [
        f"# {title}",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- device: {getattr(device, 'device_kind', device.platform)} ({jax.default_backend()}), "
        f"host {platform.node() or '?'}, python {platform.python_version()}, jax {jax.__version__}, "
        f"jaxlib {version('jaxlib')}, ejk {version('ejk-core')}, ejk-xla {version('ejk-xla')}",
        f"- median of {args.reps} samples after {WARMUP} warm-ups; each sample a loop of calls lasting >= 20 ms "
        "(dispatch amortised)" + ("; SMOKE RUN (tiny shapes)" if args.smoke else ""),
        *(f"- {note}" for note in notes),
        "",
        f"| {case} | mode | implementation | ms | {rate} | note |",
        "| --- | --- | --- | ---: | ---: | --- |",
    ]


def write(lines: list[str], args: argparse.Namespace, name: str) -> None:
    """Write the report to ``--out``, else ``$OUT/<name>``, else ``benchmarks/results/<name>``."""
    if args.smoke:
        name = name.replace(".md", "_smoke.md")
    if args.out is not None:
        path = Path(args.out)
    elif os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / name
    else:
        path = Path(__file__).parent / "results" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {path}")
