"""``ejk bench``: every implementation against the best external baselines, as tables, JSON and plots."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from rich.markup import escape

__all__ = ["add_parser"]

_DESCRIPTION = """\
For each op and shape: every implementation that can run here (through the public op, its platform
and implementation forced), platform='auto', optionally each implementation's best config, and the
external baselines (jax.nn.dot_product_attention cudnn/xla, jax's Pallas GPU attention and paged
attention, a @ b, lax.ragged_dot, a dense einsum over equal groups, x @ w + a materialised
cross-entropy (jnp, optax), the jnp RMSNorm expression), all in one process on the same inputs.
Writes bench.json (every number), bench.md and one PNG per op and mode to --out.

OP: flash_attention (attention), flash_attention_varlen (varlen), ragged_paged_attention (decode),
mla_paged_attention (mla), grouped_matmul (moe), matmul, gated_delta_rule (gdr), gla, ssd,
linear_cross_entropy (lce), rms_norm (rmsnorm); default: all of them, each with its preset shapes.
--shapes: presets (attention, varlen, decode, mla, moe, matmul, gdr, gla, ssd, lce, rmsnorm) or specs:
  attention:BxSxHxD[:causal,kv=Hkv,dv=Dv,window=W,sinks]   varlen:L1+L2+...xHxD[:causal]
  decode:SEQSxCTX[:q=1,hq=32,hkv=8,d=128,page=64]  mla:BxCTX[:sq=1,hq=16,dk=576,dv=512,page=64]
  moe:GxKxNxM[:skewed]                matmul:MxKxN
  gdr:BxT[:h=32,k=128,v=128,seqs=0]   gla:TOKENSxSEQxHxK[:packed,v=V]
  ssd:TOKENSxSEQxHxP[:packed,n=N,g=G]
  lce:TxHxV[:zloss,smooth]            rmsnorm:RxD[:residual]

Other lines: --all-configs times every config of each implementation's config space; --backward
LABEL pairs each forward with another implementation's backward (fwd+bwd). Other studies of the
same shapes: --overhead (the public op against the implementation called bare: under jax.jit and
eagerly, plus import times; --profile N writes where eager calls spend their host time) and
--tuning (how long autotuning takes with each --workers count of compile threads).
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="every implementation against the best external baselines: table, JSON, plots",
                       description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ops", nargs="*", metavar="OP", help="ops to run (default: all)")
    p.add_argument("--shapes", action="append", default=[], metavar="PRESET|SPEC",
                   help="shapes instead of the ops' presets (repeatable; ';' separates several)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--mode", default="all", choices=("fwd", "fwd+bwd", "all"),
                   help="forward only, forward + backward, or both (default)")
    p.add_argument("--out", default=None, help="output directory (default ./ejk-bench; with --from-json, the "
                                                 "JSON file's directory)")
    p.add_argument("--quick", action="store_true", help="tiny shapes and few samples: about a minute, CPU is fine")
    p.add_argument("--impl", action="append", default=[], metavar="LABEL",
                   help="only ejk lines whose implementation label starts with this (e.g. xla/gpu:cudnn, "
                        "triton; 'auto' for platform='auto'); repeatable")
    p.add_argument("--baseline", action="append", default=None, metavar="NAME",
                   help="only baselines whose name starts with this (e.g. 'jax.nn'); 'none' for no baseline")
    p.add_argument("--best-config", action="store_true",
                   help="also tune each implementation over its config space and time the winner")
    p.add_argument("--max-configs", type=int, default=8, help="configs tuned per implementation (default 8)")
    p.add_argument("--tune-seconds", type=float, default=60.0, help="tuning budget per implementation (default 60)")
    p.add_argument("--all-configs", action="store_true",
                   help="also time every config of each implementation's config space, one line each (the "
                        "heuristic's marked)")
    p.add_argument("--backward", action="append", default=[], metavar="LABEL",
                   help="fwd+bwd: also pair each implementation's forward with the backward of the implementations "
                        "whose label starts with this and that consume its residuals (ImplChoice(backward=...)); "
                        "repeatable")
    study = p.add_mutually_exclusive_group()
    study.add_argument("--overhead", action="store_true",
                       help="the overhead study instead: each implementation through the public op against its own "
                            "function called bare, under jax.jit and eagerly; plus import times")
    study.add_argument("--tuning", action="store_true",
                       help="the tuning study instead: how long autotuning platform='auto' takes with each --workers "
                            "count, each in a fresh interpreter")
    p.add_argument("--workers", default="1,4", metavar="N[,N...]",
                   help="--tuning: the compile_workers settings to compare (default 1,4)")
    p.add_argument("--profile", type=int, default=0, metavar="CALLS",
                   help="--overhead: also profile this many eager calls of each shape's public op (cProfile) into "
                        "profile_<op>_<n>.txt")
    p.add_argument("--reps", type=int, default=None, help="timed samples per line (default 10, --quick 3)")
    p.add_argument("--clock", choices=("wall", "device", "busy"), default="wall",
                   help="time samples by the host's clock (default) or by the GPU's own timeline, one jax.profiler "
                        "trace per sample, leaving out host time the device never waits for (jax-triton's launch "
                        "can wait on the host); busy: only the time the GPU runs something, gaps between calls "
                        "left out (the kernels' own time, for calls shorter than a jitted call's dispatch); "
                        "without a GPU, as wall")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument("--quiet", action="store_true", help="no progress lines, only the final tables")
    p.add_argument("--from-json", metavar="FILE", type=Path,
                   help="measure nothing: render the tables, bench.md and the plots of an earlier run's bench.json "
                        "into --out (e.g. plots on a machine with matplotlib)")
    p.add_argument("--write-pack", metavar="FILE", type=Path, default=None,
                   help="also write a config pack of the rankings the measurements support (per op, mode and shape "
                        "class; with --from-json, of that run): ship it, or list it through a plugin's "
                        "ejk_config_packs hook (docs/RANKINGS.md)")
    p.add_argument("--pack-device", metavar="PATTERN", default=None,
                   help="--write-pack: the device-fingerprint pattern of its rankings (default: the run's "
                        "'backend|Device_Kind*')")
    p.set_defaults(func=run)


def _cases(args: argparse.Namespace) -> list[Any]:
    from ejk.bench import _cases

    ops = [_cases.resolve_op(name) for name in args.ops]
    if args.shapes:
        cases = _cases.parse_shapes(args.shapes, quick=args.quick)
        return [c for c in cases if not ops or c.op in ops]
    presets = _cases.QUICK if args.quick else _cases.PRESETS
    chosen = ops or list(_cases.PRESET_OF_OP)
    return [case for op in dict.fromkeys(chosen) for case in presets[_cases.PRESET_OF_OP[op]]]


def _options(args: argparse.Namespace) -> Any:
    from ejk import AutotunePolicy
    from ejk.bench import MODES, Options

    reps = args.reps or (3 if args.quick else 10)
    policy = AutotunePolicy(warmup=1 if args.quick else 2, repeats=max(1, reps),
                            min_sample_seconds=0.002 if args.quick else 0.02, progress=False, persist=False,
                            clock=args.clock)
    baselines = None if args.baseline is None else tuple(b for b in args.baseline if b != "none")
    if args.profile and not args.overhead:
        raise ValueError("--profile belongs to the overhead study: add --overhead")
    return Options(dtype=args.dtype, modes=MODES if args.mode == "all" else (args.mode,), impls=tuple(args.impl),
                   baselines=baselines, best_config=args.best_config, all_configs=args.all_configs,
                   backward=tuple(args.backward), max_configs=max(1, args.max_configs),
                   tune_seconds=args.tune_seconds, policy=policy)


def _workers(text: str) -> tuple[int, ...]:
    """The ``--workers`` list, e.g. ``"1,4"``."""
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise ValueError(f"--workers {text!r}: expected compile thread counts >= 1 separated by commas, e.g. 1,4")
    return counts


def _study(args: argparse.Namespace) -> str:
    return "overhead" if args.overhead else "tuning" if args.tuning else "compare"


def _measure(args: argparse.Namespace, cases: list[Any], options: Any, peak: Any, console: Any,
             on_measurement: Any, on_group: Any) -> list[Any]:
    """The measurements of the study ``args`` names."""
    from ejk.bench import run as run_bench

    if args.tuning:
        from ejk.bench._tuning_study import run_tuning

        return run_tuning(cases, options, _workers(args.workers), on_measurement=on_measurement, on_group=on_group)
    if not args.overhead:
        return run_bench(cases, options, peak=peak, on_measurement=on_measurement, on_group=on_group)
    from ejk.bench._overhead import eager_overhead, profile_eager, run_overhead, startup

    found = run_overhead(cases, options, on_measurement=on_measurement, on_group=on_group)
    out = Path(args.out)
    table = eager_overhead(found)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eager_overhead.md").write_text(table, encoding="utf-8")
    console.print(f"eager calls against the same call under jax.jit (µs; also in "
                  f"{escape(str(out / 'eager_overhead.md'))}):")
    console.print(table, markup=False, highlight=False)
    for i, case in enumerate(cases if args.profile else ()):
        path = out / f"profile_{case.op}_{i}.txt"
        path.write_text(profile_eager(case, options, calls=args.profile), encoding="utf-8")
        console.print(f"  {escape(case.op)} {escape(case.label)}: eager calls profiled into {escape(str(path))}")
    imports = startup(runs=1 if args.quick else 5)
    for m in imports:
        on_measurement(m)
    on_group(imports)
    return found + imports


def _progress_line(m: Any) -> str:
    from ejk.bench._report import _ms, _note, _rate

    head = escape(f"  {m.op} {m.mode} {m.case} | {m.name}: ")
    if m.status == "ok":
        return head + escape(f"{_ms(m.median_s)} ms, {_rate(m)}")
    return f"{head}[yellow]{escape(_note(m, width=140))}[/yellow]"


def run(args: argparse.Namespace) -> int:
    import attrs

    from ejk._console import console as make_console
    from ejk.bench import environment, peak_for
    from ejk.bench._plot import MISSING, plotting_available
    from ejk.bench._report import write_json

    console = make_console()
    if args.out is None:
        args.out = args.from_json.parent if args.from_json is not None else Path("ejk-bench")
    if args.from_json is not None:
        return _render(args, console)
    try:
        cases = _cases(args)
        options = _options(args)
        if args.tuning:
            _workers(args.workers)
    except ValueError as exc:
        console.print(f"[red]ejk bench: {escape(str(exc))}[/red]")
        return 2
    if not cases:
        console.print("[red]ejk bench: no shapes selected (check OP and --shapes)[/red]")
        return 2
    out = Path(args.out)
    env = environment()
    peak = peak_for(str(env["device_kind"]))
    recorded = {"argv": sys.argv[1:], "study": _study(args), "quick": args.quick, "dtype": options.dtype,
                "modes": list(options.modes),
                "impls": list(options.impls), "baselines": options.baselines, "best_config": options.best_config,
                "all_configs": options.all_configs, "backward": list(options.backward),
                "cases": [c.label for c in cases],
                **attrs.asdict(options.policy, filter=lambda a, v: a.name in (
                    "warmup", "repeats", "min_sample_seconds", "flush_l2", "l2_flush_bytes", "clock"))}
    console.print(f"ejk bench: {len(cases)} shape(s) on {env['device_kind']} ({env['backend']}); "
                  f"peak: {peak.name if peak else 'unknown device'}; writing to {out}")
    if not args.no_plot and not plotting_available():
        console.print(f"[yellow]{escape(MISSING)}[/yellow]")
    start = time.perf_counter()
    done: list[Any] = []

    def on_group(group: list[Any]) -> None:  # the JSON file is complete after every group
        done.extend(group)
        write_json(out / "bench.json", done, env, recorded, peak, time.perf_counter() - start)

    def on_measurement(m: Any) -> None:
        if not args.quiet:
            console.print(_progress_line(m), highlight=False)

    out.mkdir(parents=True, exist_ok=True)
    measurements = _measure(args, cases, options, peak, console, on_measurement, on_group)
    wall = time.perf_counter() - start
    write_json(out / "bench.json", measurements, env, recorded, peak, wall)
    return _finish(args, console, measurements, env, recorded, peak, wall)


def _render(args: argparse.Namespace, console: Any) -> int:
    from ejk.bench._peaks import Peak
    from ejk.bench._report import read_json

    try:
        measurements, data = read_json(args.from_json)
    except (OSError, ValueError) as exc:
        console.print(f"[red]ejk bench --from-json: {escape(str(exc))}[/red]")
        return 2
    found = data.get("peak")
    peak = None if not found else Peak(name=found["name"], match=(), tflops=found["tflops"],
                                       bandwidth_gbs=found["bandwidth_gbs"], source=found["source"])
    return _finish(args, console, measurements, data.get("environment") or {}, data.get("options") or {}, peak,
                   data.get("wall_seconds"))


def _finish(args: argparse.Namespace, console: Any, measurements: list[Any], env: dict[str, Any],
            recorded: dict[str, Any], peak: Any, wall: float | None) -> int:
    """The tables, bench.md and the plots of ``measurements``; the exit status."""
    from ejk.bench._plot import plot, plotting_available
    from ejk.bench._report import by_op_and_mode, headlines, markdown, table

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = str(env.get("device_kind", "?"))
    for (op, mode), group in by_op_and_mode(measurements).items():
        console.print(table(group, f"{op} {mode} ({recorded.get('dtype', '?')}, {device})"))
    plots: list[Path] = []
    if not args.no_plot and plotting_available():
        plots = plot(measurements, out, device=device)
    (out / "bench.md").write_text(markdown(measurements, env, recorded, peak, [str(p) for p in plots]) + "\n",
                                  encoding="utf-8")
    for line in headlines(measurements):
        console.print(f"[bold]{escape(line)}[/bold]", highlight=False)
    if getattr(args, "write_pack", None) is not None:
        _write_pack(args, console, measurements, env)
    counts = {s: sum(m.status == s for m in measurements) for s in ("ok", "skipped", "failed", "oom")}
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    took = f" in {wall:.0f} s" if wall is not None else ""
    console.print(f"{len(measurements)} lines ({summary}){took}; wrote {out / 'bench.md'}"
                  + (f" and {len(plots)} plot(s)" if plots else "") + f" to {out}")
    return 0 if counts["ok"] else 1


def _write_pack(args: argparse.Namespace, console: Any, measurements: list[Any], env: dict[str, Any]) -> None:
    """``--write-pack``: the rankings of ``measurements`` as a config pack."""
    from ejk.bench._packs import default_device_pattern, rankings_pack
    from ejk.config.cache_file import atomic_write_json

    source = str(args.from_json) if args.from_json is not None else str(Path(args.out) / "bench.json")
    pack = rankings_pack(measurements, device=args.pack_device or default_device_pattern(env), source=source)
    path = Path(args.write_pack)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(str(path), pack)
    count = sum(len(v) for v in pack["rankings"].values())
    console.print(f"wrote {count} ranking(s) to the config pack {path}", highlight=False)
