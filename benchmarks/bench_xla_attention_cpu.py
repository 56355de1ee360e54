"""Memory and time of the chunked XLA flash attention vs the materialised reference, on the CPU.

Every (implementation, mode, sequence length) is measured in a fresh subprocess so its peak
RSS (``resource.getrusage``) is its own. Reported per line:

- ``ms``: median wall time of the jitted call (after a warm-up call),
- ``peak RSS``: the process's peak resident memory, and ``Δ RSS`` the part above the RSS it
  had with JAX imported and the inputs created (before compiling),
- ``XLA temp``: ``compiled.memory_analysis().temp_size_in_bytes`` (XLA's own buffer assignment
  for temporaries; inputs and outputs excluded).

Usage:
    python benchmarks/bench_xla_attention_cpu.py [--seqs 512 1024 ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).parent / "results" / "xla_attention_cpu.md"
IMPLS = ("flash", "reference")
MODES = ("fwd", "fwd+bwd")


def _peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _attention_fn(impl: str, causal: bool) -> Any:
    """``fn(q, k, v)`` of one implementation (user-level defaults: scale 1/sqrt(D))."""
    import math

    if impl == "reference":
        import functools

        from ejk.testing import reference_flash_attention

        return functools.partial(reference_flash_attention, causal=causal)
    from ejk_xla._flash_attention import flash_attention

    def fn(q: Any, k: Any, v: Any) -> Any:
        return flash_attention(
            q, k, v, causal=causal, softmax_scale=1 / math.sqrt(q.shape[-1]), sliding_window=None,
            logits_soft_cap=None, q_segment_ids=None, kv_segment_ids=None, bias=None,
        )

    return fn


def child(impl: str, mode: str, seq: int, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement (runs inside the fresh subprocess)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (args.batch, seq, args.heads, args.dim)
    q, k, v = (jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(args.dtype) for _ in range(3))
    attention = _attention_fn(impl, args.causal)
    if mode == "fwd":
        fn = attention
    else:

        def fn(q: Any, k: Any, v: Any) -> Any:
            out, vjp = jax.vjp(attention, q, k, v)
            return out, vjp(out)

    jax.block_until_ready((q, k, v))
    baseline = _peak_rss_mib()
    compiled = jax.jit(fn).lower(q, k, v).compile()
    analysis = compiled.memory_analysis()
    temp = None if analysis is None else int(analysis.temp_size_in_bytes)
    jax.block_until_ready(compiled(q, k, v))
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        jax.block_until_ready(compiled(q, k, v))
        times.append(time.perf_counter() - start)
    peak = _peak_rss_mib()
    return {"ms": statistics.median(times) * 1e3, "peak": peak, "delta": peak - baseline, "temp": temp}


def _run_child(impl: str, mode: str, seq: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable, __file__, "--child", impl, mode, str(seq), "--batch", str(args.batch),
        "--heads", str(args.heads), "--dim", str(args.dim), "--dtype", args.dtype, "--reps", str(args.reps),
    ] + (["--causal"] if args.causal else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:120]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _row(impl: str, mode: str, seq: int, r: dict[str, Any]) -> str:
    if "error" in r:
        return f"| {seq} | {impl} | {mode} | failed: {r['error']} | | | |"
    temp = None if r["temp"] is None else r["temp"] / 2**20
    return f"| {seq} | {impl} | {mode} | {r['ms']:,.1f} | {_mib(r['peak'])} | {_mib(r['delta'])} | {_mib(temp)} |"


def _header(args: argparse.Namespace) -> list[str]:
    import jax

    cores = os.cpu_count()
    return [
        "# XLA flash attention vs materialised reference (CPU)",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {platform.machine()}, {cores} CPU cores, {platform.platform()}",
        f"- python {platform.python_version()}, jax {jax.__version__}, backend {jax.default_backend()}",
        f"- shape [batch={args.batch}, seq, heads={args.heads}, head_dim={args.dim}] {args.dtype}, "
        f"causal={args.causal}; flash uses its heuristic config; median of {args.reps} runs after a warm-up",
        "- fwd+bwd: one jitted call computing the output and the q/k/v gradients",
        "- peak RSS: whole process (fresh subprocess per line); Δ RSS: above the RSS with inputs created; "
        "XLA temp: compiled temporaries (MiB)",
        *([f"- note: {args.note}"] if args.note else []),
        "",
        "| seq | impl | mode | ms | peak RSS MiB | Δ RSS MiB | XLA temp MiB |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--note", default="", help="a line added to the header (e.g. machine load)")
    parser.add_argument("--child", nargs=3, metavar=("IMPL", "MODE", "SEQ"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        impl, mode, seq = args.child
        print(json.dumps(child(impl, mode, int(seq), args)))
        return
    lines = _header(args)
    print("\n".join(lines), flush=True)
    for seq in args.seqs:
        for mode in args.modes:
            for impl in IMPLS:
                row = _row(impl, mode, seq, _run_child(impl, mode, seq, args))
                print(row, flush=True)
                lines.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
