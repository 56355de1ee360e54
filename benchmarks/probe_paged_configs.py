"""Time a grid of paged decode configs (ejk-pallas or ejk-triton) on one shape, fastest first (GPU host).

Usage: ``python benchmarks/probe_paged_configs.py 8,2048 [16,2048 ...] [--platform triton] [--top 8]``:
batch and context (32 q heads over 8 kv heads, D = 128, page 64, bf16: ``bench_pallas_ops.py``'s decode
shapes). The grid (each list an option): keys per step 32 / 64 / 128, split-K 2–16, stages 2–4, warps 4
(and 2, 8 at 64 keys); for ejk-triton also the merge in the kernel or in JAX. Each config is timed by
``_harness.device_ms`` (20 dependent calls in one program), the heuristic's marked: it looks further than
the config space's neighbourhood of the heuristic, which the benchmarks sample.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
from collections.abc import Callable
from typing import Any

import _harness
import jax
from bench_pallas_ops import HBM_GBS, paged_inputs

import ejk

#: platform: (module with the config class and heuristic, implementation name, extra config fields to vary)
PLATFORMS = {"pallas": ("ejk_pallas._paged_attention", "triton_lowered", {}),
             "triton": ("ejk_triton._paged_attention", "paged", {"fused_merge": (False, True)})}


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def grid(config: Any, extra: dict[str, tuple[Any, ...]], args: argparse.Namespace) -> list[Any]:
    """Keys x splits x stages (4 warps; no 4 stages at 128 keys), then other warps and the extra fields'
    other values at 64 keys, 3 stages."""
    merge = {"fused_merge": True} if args.fused_merge else {}
    out = [config(block_kv=kv, num_splits=z, num_stages=s, **merge)
           for kv, z, s in itertools.product(ints(args.keys), ints(args.splits), ints(args.stages))
           if not (kv == 128 and s == 4)]
    if args.no_extras:
        return out
    out += [config(block_kv=64, num_splits=z, num_stages=3, num_warps=w)
            for z, w in itertools.product((4, 6, 8), ints(args.warps))]
    for name, values in extra.items():
        out += [config(block_kv=64, num_splits=z, num_stages=3, **{name: v})
                for z, v in itertools.product((3, 4, 6, 8, 12), values[1:])]
    return out


def label(cfg: Any) -> str:
    merge = "/fused-merge" if getattr(cfg, "fused_merge", False) else ""
    return f"kv{cfg.block_kv}/z{cfg.num_splits}/s{cfg.num_stages}/w{cfg.num_warps}{merge}"


def parse_label(config: Any, text: str) -> Any:
    """The config a :func:`label` names (``kv64/z6/s2/w4`` with an optional ``/fused-merge``)."""
    fields = {"kv": "block_kv", "z": "num_splits", "s": "num_stages", "w": "num_warps"}
    kwargs: dict[str, Any] = {}
    for part in text.split("/"):
        if part == "fused-merge":
            kwargs["fused_merge"] = True
            continue
        key = part.rstrip("0123456789")
        if key not in fields or key == part:
            raise SystemExit(f"--profile {text!r}: {part!r} is not one of kvN, zN, sN, wN, fused-merge")
        kwargs[fields[key]] = int(part[len(key):])
    return config(**kwargs)


def paged_call(platform: str, implementation: str, cfg: Any, backend: str) -> Callable[..., Any]:
    """``ejk.ragged_paged_attention`` pinned to one implementation and config."""
    choice = ejk.ImplChoice(platform=platform, backend=backend, implementation=implementation, cfg=cfg)
    return lambda *a: ejk.ragged_paged_attention(*a, platform=platform, cfg=choice)


def profile(config: Any, chosen: Any, args: argparse.Namespace, implementation: str, inputs: tuple[Any, ...],
            backend: str) -> None:
    """Run one config ``args.calls`` times (compiled once), untimed."""
    cfg = chosen if args.profile == "heuristic" else parse_label(config, args.profile)
    run = jax.jit(paged_call(args.platform, implementation, cfg, backend))
    for _ in range(args.calls):
        jax.block_until_ready(run(*inputs))
    print(f"profiled {args.platform} {label(cfg)} x{args.calls}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("shapes", nargs="+")
    p.add_argument("--platform", choices=sorted(PLATFORMS), default="pallas")
    p.add_argument("--keys", default="32,64,128", help="keys per step to try")
    p.add_argument("--splits", default="2,3,4,5,6,8,10,12,16", help="split-K counts to try")
    p.add_argument("--stages", default="2,3,4")
    p.add_argument("--warps", default="2,8", help="warps other than 4 (at 64 keys, 3 stages)")
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--no-extras", action="store_true", help="only the keys x splits x stages grid")
    p.add_argument("--fused-merge", action="store_true", help="ejk-triton: the keys x splits x stages grid merges "
                   "the splits in the kernel (the default merges them in JAX)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--profile", metavar="LABEL", help="only run this config (a label as printed, or 'heuristic') "
                   "--calls times, untimed: for a profiler such as ncu")
    p.add_argument("--calls", type=int, default=5)
    args = p.parse_args()
    module, implementation, extra = PLATFORMS[args.platform]
    paged = importlib.import_module(module)
    backend = "gpu" if jax.default_backend() == "gpu" else "cpu"
    for shape in args.shapes:
        b, ctx = (int(x) for x in shape.split(","))
        inputs = paged_inputs(b, ctx, 64, 32, 8, 128)
        gbytes = (inputs[1].nbytes + inputs[2].nbytes) / 1e9  # the KV cache, read once
        chosen = paged.heuristic_config(*inputs)
        configs = [chosen, *(c for c in grid(paged.PagedAttentionConfig, extra, args) if c != chosen)]
        if args.profile:
            profile(paged.PagedAttentionConfig, chosen, args, implementation, inputs, backend)
            continue
        times = {}
        for cfg in configs:
            try:
                times[cfg] = _harness.device_ms(paged_call(args.platform, implementation, cfg, backend), inputs,
                                                args.reps)
            except Exception as exc:  # report and go on
                print(f"  {cfg}: failed: {_harness.error_text(exc)}", flush=True)
        print(f"{args.platform} B={b} ctx={ctx}: {len(times)} configs; heuristic {label(chosen)} "
              f"{times.get(chosen, float('nan')) * 1e3:.1f} us", flush=True)
        for cfg in sorted(times, key=times.__getitem__)[: args.top]:
            rate = gbytes / (times[cfg] * 1e-3)
            print(f"  {label(cfg)}: "
                  f"{times[cfg] * 1e3:.1f} us {rate:.0f} GB/s ({100 * rate / HBM_GBS:.0f}% HBM)"
                  f"{'  <- heuristic' if cfg == chosen else ''}", flush=True)


if __name__ == "__main__":
    main()
