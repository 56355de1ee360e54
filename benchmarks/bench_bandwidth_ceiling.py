"""What HBM traffic shaped like RMSNorm's reaches on this GPU (torch + Triton, no jax): the ceiling for issue 34.

RMSNorm forward+backward at ``[R, D]`` moves five ``[R, D]`` arrays: forward reads ``x`` and writes ``y``,
backward reads ``x`` and ``dy`` and writes ``dx``. This script times, on the same arrays:

* ``torch copy``: ``y.copy_(x)`` (one read, one write);
* ``triton copy``: a plain Triton copy kernel, with and without streaming cache hints
  (``evict_first`` loads, ``.cs`` stores), at several block sizes;
* ``triton read2 write1``: ``dx = x + dy`` (the backward's traffic without its arithmetic);
* ``triton rms fwd`` / ``triton rms bwd``: RMSNorm's forward and backward as ejk-triton computes them
  (whole rows in registers), with and without the cache hints, persistent and one-block-per-program.

Each line prints GB/s and its share of the device's HBM peak (``--peak-gbs``, default 3350, the H100 SXM's
3.35 TB/s) as one JSON line. Timing: ``triton.testing.do_bench`` (CUDA events, L2 flushed between calls).

    python3 benchmarks/bench_bandwidth_ceiling.py [--rows 16384] [--d 4096]
"""

# ruff: noqa: N803 (Triton kernels name their compile-time constants in capitals)
from __future__ import annotations

import argparse
import functools
import json
from typing import Any

import torch
import triton
import triton.language as tl


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr, HINTS: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if HINTS:
        v = tl.load(x_ptr + offs, mask=mask, eviction_policy="evict_first")
        tl.store(y_ptr + offs, v, mask=mask, cache_modifier=".cs")
    else:
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _read2_write1(x_ptr, dy_ptr, dx_ptr, n, BLOCK: tl.constexpr, HINTS: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if HINTS:
        a = tl.load(x_ptr + offs, mask=mask, eviction_policy="evict_first")
        b = tl.load(dy_ptr + offs, mask=mask, eviction_policy="evict_first")
        tl.store(dx_ptr + offs, a + b, mask=mask, cache_modifier=".cs")
    else:
        tl.store(dx_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(dy_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _rms_fwd(x_ptr, s_ptr, y_ptr, inv_ptr, ROWS: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr,
             HINTS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, D)
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    if HINTS:
        x = tl.load(x_ptr + offs, eviction_policy="evict_first").to(tl.float32)
    else:
        x = tl.load(x_ptr + offs).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=1) / D + 1e-6)
    s = tl.load(s_ptr + cols).to(tl.float32)
    y = (x * inv[:, None] * s[None, :]).to(y_ptr.dtype.element_ty)
    if HINTS:
        tl.store(y_ptr + offs, y, cache_modifier=".cs")
    else:
        tl.store(y_ptr + offs, y)
    tl.store(inv_ptr + rows, inv)


@triton.jit
def _rms_bwd(x_ptr, s_ptr, inv_ptr, dy_ptr, dx_ptr, part_ptr, ROWS: tl.constexpr, D: tl.constexpr,
             BLOCK_R: tl.constexpr, PROGRAMS: tl.constexpr, HINTS: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, D)
    s = tl.load(s_ptr + cols).to(tl.float32)
    acc = tl.zeros((BLOCK_R, D), dtype=tl.float32)
    for blk in range(pid, ROWS // BLOCK_R, PROGRAMS):
        rows = blk * BLOCK_R + tl.arange(0, BLOCK_R)
        offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
        if HINTS:
            x = tl.load(x_ptr + offs, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dy_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(x_ptr + offs).to(tl.float32)
            dy = tl.load(dy_ptr + offs).to(tl.float32)
        inv = tl.load(inv_ptr + rows)
        xhat = x * inv[:, None]
        g = dy * s[None, :]
        c = tl.sum(g * xhat, axis=1) / D
        dx = (inv[:, None] * (g - xhat * c[:, None])).to(dx_ptr.dtype.element_ty)
        if HINTS:
            tl.store(dx_ptr + offs, dx, cache_modifier=".cs")
        else:
            tl.store(dx_ptr + offs, dx)
        acc += dy * xhat
    tl.store(part_ptr + pid * D + cols, tl.sum(acc, axis=0))


def _gbs(nbytes: int, fn: Any) -> tuple[float, float]:
    ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
    return ms, nbytes / ms / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--d", type=int, default=4096)
    p.add_argument("--peak-gbs", type=float, default=3350.0)
    a = p.parse_args()
    rows, d = a.rows, a.d
    n = rows * d
    x = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    y = torch.empty_like(x)
    s = torch.randn(d, device="cuda", dtype=torch.bfloat16)
    inv = torch.empty(rows, device="cuda", dtype=torch.float32)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    one = n * x.element_size()

    def emit(line: str, ms: float, gbs: float, **extra: Any) -> None:
        print(json.dumps(dict(line=line, ms=round(ms, 4), gbs=round(gbs, 1), hbm=round(gbs / a.peak_gbs, 3),
                              device=torch.cuda.get_device_name(), rows=rows, d=d, **extra)), flush=True)

    emit("torch copy", *_gbs(2 * one, lambda: y.copy_(x)))
    emit("torch x * s", *_gbs(2 * one, lambda: torch.mul(x, s, out=y)))
    for block in (1024, 4096, 8192, 16384):
        for hints in (False, True):
            grid = (triton.cdiv(n, block),)
            emit("triton copy", *_gbs(2 * one, functools.partial(_copy[grid], x, y, n, BLOCK=block, HINTS=hints,
                                                                 num_warps=8)), block=block, hints=hints)
            emit("triton read2 write1", *_gbs(3 * one, functools.partial(
                _read2_write1[grid], x, dy, y, n, BLOCK=block, HINTS=hints, num_warps=8)), block=block, hints=hints)
    for block_r, warps in ((1, 4), (1, 8), (2, 8), (2, 16), (4, 16)):
        for hints in (False, True):
            grid = (rows // block_r,)
            emit("triton rms fwd", *_gbs(2 * one, functools.partial(
                _rms_fwd[grid], x, s, y, inv, ROWS=rows, D=d, BLOCK_R=block_r, HINTS=hints, num_warps=warps)),
                 block_r=block_r, warps=warps, hints=hints)
    for block_r, warps, per_sm in ((1, 8, 2), (1, 8, 4), (2, 16, 1), (1, 4, 4), (2, 8, 2)):
        for hints in (False, True):
            programs = sms * per_sm
            part = torch.empty(programs, d, device="cuda", dtype=torch.float32)
            emit("triton rms bwd", *_gbs(3 * one, functools.partial(
                _rms_bwd[(programs,)], x, s, inv, dy, y, part, ROWS=rows, D=d, BLOCK_R=block_r, PROGRAMS=programs,
                HINTS=hints, num_warps=warps)), block_r=block_r, warps=warps, per_sm=per_sm, hints=hints)


if __name__ == "__main__":
    main()
