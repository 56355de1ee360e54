"""Shared pieces of the GPU benchmark scripts: options, timing, header, where results go."""

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

from ejk.config import _device_clock

WARMUP = 2


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every benchmark takes: ``--smoke``, ``--reps``, ``--out``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes and configs (CPU is fine)")
    p.add_argument("--reps", type=int, default=None, help="timed calls per line (default 10, smoke 2)")
    p.add_argument("--out", default=None, help="markdown file to write (default: $OUT/<name> or results/)")
    return p


def add_timer_option(p: argparse.ArgumentParser) -> None:
    """``--timer span|loop``, read back by :func:`timer`."""
    p.add_argument("--timer", choices=("span", "loop"), default="span",
                   help="span: per-call time on the GPU's own timeline (span_ms; host time the device never "
                        "waits for is left out; without a GPU, as loop); loop: wall time of back-to-back calls "
                        "(time_ms)")


def timer(args: argparse.Namespace) -> Callable[..., float]:
    """The timer ``--timer`` names; :func:`time_ms` for smoke runs and wherever JAX has no GPU."""
    span = getattr(args, "timer", "loop") == "span" and not args.smoke and jax.default_backend() == "gpu"
    return span_ms if span else time_ms


def parse(p: argparse.ArgumentParser) -> argparse.Namespace:
    args = p.parse_args()
    args.reps = args.reps or (2 if args.smoke else 10)
    return args


def time_ms(fn: Callable[..., Any], args: tuple[Any, ...], reps: int, *, min_sample_s: float = 0.02) -> float:
    """Median milliseconds per call of the compiled ``fn`` after warm-up (compilation is never timed).

    Each of the ``reps`` samples times a loop of back-to-back calls lasting at least
    ``min_sample_s`` and blocks only at its end, so host dispatch (about 40 µs a call on the
    H100 host) overlaps the device work instead of adding to it.
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


def gpu_timeline(compiled: Callable[..., Any], args: tuple[Any, ...], calls: int) -> list[tuple[str, int, int]]:
    """``(kernel name, start ns, end ns)`` of every GPU activity while ``calls`` back-to-back calls of
    ``compiled`` run, from a ``jax.profiler`` trace (``ejk.config._device_clock``), in start order."""
    events = _device_clock.trace_gpu_events(lambda: compiled(*args), calls)
    if not events:
        raise RuntimeError("no GPU timeline was recorded (it needs a GPU and no other profiler session)")
    return events


def span_ms(fn: Callable[..., Any], args: tuple[Any, ...], reps: int, *, calls: int = 10) -> float:
    """Median milliseconds per call on the device's own timeline (:func:`gpu_timeline`).

    Each of the ``reps`` samples traces ``calls`` back-to-back calls and takes the span from the
    first kernel's start to the last one's end over ``calls``: gaps between calls count, host time
    the device never waits for does not. Use it where :func:`time_ms` measures the host (a slow
    dispatch path) instead of the device. The autotuner's ``AutotunePolicy(clock="device")`` times
    the same way.
    """
    compiled = jax.jit(fn).lower(*args).compile()
    for _ in range(WARMUP):
        jax.block_until_ready(compiled(*args))
    samples = []
    for _ in range(reps):
        samples.append((_device_clock.events_span_ns(gpu_timeline(compiled, args, calls)) or 0) / calls / 1e6)
    return float(statistics.median(samples))


def chained(fn: Callable[..., Any], n: int) -> Callable[..., Any]:
    """``n`` calls of ``fn`` in one program, each call's first argument made to depend on the previous
    call's output (``+ 0 * out[0]``, one tiny elementwise op), so XLA neither merges nor reorders them."""
    def run(*args: Any) -> Any:
        out = fn(*args)
        for _ in range(n - 1):
            first = jax.tree.leaves(out)[0].ravel()[0]
            out = fn(args[0] + (first * 0).astype(args[0].dtype), *args[1:])
        return out

    return run


def device_ms(fn: Callable[..., Any], args: tuple[Any, ...], reps: int, *, chain: int = 20) -> float:
    """Milliseconds per call with host dispatch out of the way: :func:`time_ms` of :func:`chained`
    ``chain`` calls, divided by ``chain``. For kernels shorter than a dispatch (about 40 µs on the
    H100 host), where :func:`time_ms` measures the host; includes one tiny elementwise op per call."""
    return time_ms(chained(fn, chain), args, reps) / chain


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
        f"- median of {args.reps} samples after {WARMUP} warm-ups; "
        + ("each sample 10 back-to-back calls timed on the GPU's own timeline (span_ms)" if timer(args) is span_ms
           else "each sample a loop of calls lasting >= 20 ms (dispatch amortised)")
        + ("; SMOKE RUN (tiny shapes)" if args.smoke else ""),
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
