"""Tuning time of ``ejk.flash_attention`` through the xla plugin: serial vs parallel compilation.

Each setting of ``AutotunePolicy.compile_workers`` tunes the same call in a fresh subprocess
(so no compilation is reused from an earlier run), with persistence off. Printed as markdown:
one table of totals per setting (wall time, the compile phase's wall time, counts), one of
each candidate's compile seconds and timing per setting.

Usage:
    python benchmarks/bench_tuning.py                 # small CPU shape [1, 512, 4, 64] float32
    python benchmarks/bench_tuning.py --gpu-shapes    # [4, 4096, 16, 128] bfloat16 causal (H100)
    python benchmarks/bench_tuning.py --workers 1 2 4 8 --out results.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

CPU_SHAPE, CPU_DTYPE = (1, 512, 4, 64), "float32"
GPU_SHAPE, GPU_DTYPE = (4, 4096, 16, 128), "bfloat16"


def tune_once(shape: list[int], dtype: str, causal: bool, workers: int | None) -> dict[str, Any]:
    """Tune one flash-attention call in this process; the autotune event's numbers as a dict."""
    import jax
    import jax.numpy as jnp

    import ejk

    policy = ejk.AutotunePolicy(mode="autotune", persist=False, progress=False,
                                **({} if workers is None else {"compile_workers": workers}))
    events: list[Any] = []
    chain = ejk.ConfigSelectorChain(policy=policy, on_event=events.append, persist=False)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, tuple(shape), jnp.dtype(dtype)) for key in keys)
    with ejk.use_executor(ejk.Executor(chain)):
        jax.jit(lambda q, k, v: ejk.flash_attention(q, k, v, causal=causal)).lower(q, k, v)  # tunes at trace time
    tuned = [e for e in events if e.tune is not None and e.tier == "autotune"]
    if not tuned:
        raise SystemExit(f"no autotuning happened; events: {[(e.tier, e.detail) for e in events]}")
    result = tuned[-1].tune
    return {
        "workers": result.compile_workers,
        "device": str(jax.devices()[0].device_kind),
        "describe": result.describe(),
        "wall_s": result.wall_seconds,
        "compile_wall_s": result.compile_wall_seconds,
        "counts": {s: result.count(s) for s in ("timed", "failed", "pruned", "budget")},
        "best": str(result.best),
        "trials": [{"cfg": str(t.cfg), "status": t.status, "compile_s": t.compile_seconds, "median_s": t.seconds,
                    "min_s": t.min_seconds, "max_s": t.max_seconds, "calls": t.calls_per_sample,
                    "error": t.error} for t in result.trials],
    }


def _run_child(shape: list[int], dtype: str, causal: bool, workers: int | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--shape", *map(str, shape), "--dtype", dtype]
    cmd += ["--causal"] if causal else []
    cmd += ["--workers", str(workers)] if workers is not None else []
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"child {cmd} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _fmt(seconds: float | None, unit: float = 1.0, digits: int = 2) -> str:
    return "-" if seconds is None else f"{seconds * unit:.{digits}f}"


def report(runs: list[dict[str, Any]], shape: list[int], dtype: str, causal: bool) -> list[str]:
    """Markdown tables: totals per setting, then each candidate per setting."""
    first = runs[0]
    lines = [
        "# Autotuning time: ejk.flash_attention through ejk-xla",
        "",
        f"- device: {first['device']}; q/k/v {shape} {dtype}{' causal' if causal else ''}; persistence off; "
        "each setting in a fresh process",
        "- compile phase: wall time of lowering (calling thread) plus compiling (compile_workers threads); "
        "timing: each candidate's output checked, then 5 samples of looped calls",
        "",
        "| compile_workers | candidates | timed | failed | pruned | over budget | total s | compile phase s "
        "| compile s / candidate (sum / n) | timing s | winner |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for run in runs:
        compiled = [t["compile_s"] for t in run["trials"] if t["compile_s"] is not None]
        per = sum(compiled) / len(compiled) if compiled else None
        timing = run["wall_s"] - (run["compile_wall_s"] or 0.0)
        c = run["counts"]
        lines.append(f"| {run['workers']} | {len(run['trials'])} | {c['timed']} | {c['failed']} | {c['pruned']} "
                     f"| {c['budget']} | {_fmt(run['wall_s'])} | {_fmt(run['compile_wall_s'])} | {_fmt(per)} "
                     f"| {_fmt(timing)} | {run['best']} |")
    lines += ["", "| candidate | " + " | ".join(f"compile s (w={r['workers']}) | median ms (w={r['workers']})"
                                               for r in runs) + " | min–max ms (first) | calls/sample (first) |",
              "| --- | " + " | ".join("---: | ---:" for _ in runs) + " | ---: | ---: |"]
    for i, trial in enumerate(first["trials"]):
        cells = []
        for run in runs:
            t = run["trials"][i]
            timed = _fmt(t["median_s"], 1e3, 3) if t["error"] is None else t["status"]
            cells.append(f"{_fmt(t['compile_s'])} | {timed}")
        spread = f"{_fmt(trial['min_s'], 1e3, 3)}–{_fmt(trial['max_s'], 1e3, 3)}"
        lines.append(f"| {trial['cfg']} | " + " | ".join(cells) + f" | {spread} | {trial['calls']} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu-shapes", action="store_true", help=f"{list(GPU_SHAPE)} {GPU_DTYPE} causal (for an H100)")
    p.add_argument("--shape", type=int, nargs=4, default=None, help="B S H D (default: the CPU shape)")
    p.add_argument("--dtype", default=None)
    p.add_argument("--causal", action="store_true", help="causal attention (always with --gpu-shapes)")
    p.add_argument("--workers", type=int, nargs="*", default=None,
                   help="compile_workers settings (default: 1 and the policy default)")
    p.add_argument("--out", default=None, help="also write the markdown here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    shape = args.shape or list(GPU_SHAPE if args.gpu_shapes else CPU_SHAPE)
    dtype = args.dtype or (GPU_DTYPE if args.gpu_shapes else CPU_DTYPE)
    causal = args.causal or args.gpu_shapes
    if args.child:
        workers = args.workers[0] if args.workers else None
        print(json.dumps(tune_once(shape, dtype, causal, workers)))
        return
    settings: list[int | None] = list(args.workers) if args.workers else [1, None]
    runs = [_run_child(shape, dtype, causal, w) for w in settings]
    lines = report(runs, shape, dtype, causal)
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
