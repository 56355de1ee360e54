"""Time a grid of ejk-pallas paged decode configs on one shape, fastest first (GPU host).

Usage: ``python benchmarks/probe_paged_configs.py 8,2048 [16,2048 ...] [--top 8]``: batch and context
(32 q heads over 8 kv heads, D = 128, page 64, bf16: ``bench_pallas_ops.py``'s decode shapes). The grid:
keys per step 32 / 64 / 128, split-K 2–16, stages 2–4, warps 4 (and 2, 8 at 64 keys); each timed by
``_harness.device_ms`` (20 dependent calls in one program), the heuristic's config marked. Finds a better
heuristic than the config space's neighbourhood of the current one, which the benchmark samples.
"""

from __future__ import annotations

import argparse
import itertools

import _harness
from bench_pallas_ops import HBM_GBS, paged_inputs, pallas

import ejk
from ejk_pallas._paged_attention import PagedAttentionConfig, heuristic_config


def grid() -> list[PagedAttentionConfig]:
    out = [PagedAttentionConfig(block_kv=kv, num_splits=z, num_stages=s)
           for kv, z, s in itertools.product((32, 64, 128), (2, 3, 4, 5, 6, 8, 10, 12, 16), (2, 3, 4))
           if not (kv == 128 and s == 4)]
    out += [PagedAttentionConfig(block_kv=64, num_splits=z, num_stages=3, num_warps=w)
            for z, w in itertools.product((4, 6, 8), (2, 8))]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("shapes", nargs="+")
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    for shape in args.shapes:
        b, ctx = (int(x) for x in shape.split(","))
        inputs = paged_inputs(b, ctx, 64, 32, 8, 128)
        gbytes = 2.0 * b * ctx * 8 * 128 * 2 / 1e9
        chosen = heuristic_config(*inputs)
        configs = [chosen, *(c for c in grid() if c != chosen)]
        times = {}
        for cfg in configs:
            try:
                times[cfg] = _harness.device_ms(
                    lambda *a, c=cfg: ejk.ragged_paged_attention(*a, platform="pallas", cfg=pallas(c)), inputs,
                    args.reps)
            except Exception as exc:  # report and go on
                print(f"  {cfg}: failed: {_harness.error_text(exc)}", flush=True)
        print(f"B={b} ctx={ctx}: {len(times)} configs; heuristic {chosen.block_kv}/z{chosen.num_splits}/"
              f"s{chosen.num_stages}/w{chosen.num_warps} {times.get(chosen, float('nan')) * 1e3:.1f} us", flush=True)
        for cfg in sorted(times, key=times.__getitem__)[: args.top]:
            rate = gbytes / (times[cfg] * 1e-3)
            print(f"  kv{cfg.block_kv}/z{cfg.num_splits}/s{cfg.num_stages}/w{cfg.num_warps}: "
                  f"{times[cfg] * 1e3:.1f} us {rate:.0f} GB/s ({100 * rate / HBM_GBS:.0f}% HBM)"
                  f"{'  <- heuristic' if cfg == chosen else ''}", flush=True)


if __name__ == "__main__":
    main()
