"""Fused linear cross-entropy baselines users compare ejk with, timed in torch on the GPU host: Liger, Cut
Cross-Entropy and torch's unfused loss, with their peak memory.

Run with the host's own python3 (torch, triton) and the baseline wheels on ``PYTHONPATH`` (``liger-kernel``,
``cut-cross-entropy``). Prints one JSON line per measurement (``name``, ``shape``, ``ms`` the median of CUDA-event
timings, ``peak_gib`` the extra device memory the call peaked at) and writes them all to ``--out``. Run it in its
own process: JAX and torch do not share a GPU allocator. (fla's linear-attention kernels are ``ejk bench``
baselines of ``gdr``, ``gla`` and ``ssd``, in the same process as ejk's lines.)

    python3 benchmarks/torch_baselines.py --out results.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch

_REPS = 10


def _time(fn: Callable[[], Any], reps: int = _REPS) -> tuple[float, float]:
    """Median milliseconds of ``fn`` and the peak GiB it allocated beyond what was live before."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    return statistics.median(times), peak


def _emit(rows: list[dict[str, Any]], name: str, shape: str, fn: Callable[[], Any]) -> None:
    try:
        ms, peak = _time(fn)
        row: dict[str, Any] = {"name": name, "shape": shape, "ms": round(ms, 4), "peak_gib": round(peak, 3)}
    except Exception as exc:  # a baseline that refuses this toolchain is reported, not fatal
        row = {"name": name, "shape": shape, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    rows.append(row)
    print(json.dumps(row), flush=True)


def _fwd_bwd(fn: Callable[[], Any], inputs: list[torch.Tensor]) -> Callable[[], Any]:
    def step() -> None:
        for x in inputs:
            x.grad = None
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()

    return step


def _cross_entropy_vocab(rows: list[dict[str, Any]], tokens: int, hidden: int, vocab: int) -> None:
    dev, dt = "cuda", torch.bfloat16
    x = (torch.randn(tokens, hidden, device=dev, dtype=dt) * 0.5).requires_grad_()
    w = (torch.randn(vocab, hidden, device=dev, dtype=dt) * hidden**-0.5).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), device=dev)
    shape = f"T{tokens} H{hidden} V{vocab}"
    _emit(rows, "torch unfused x@w + cross_entropy fwd+bwd", shape,
          _fwd_bwd(lambda: torch.nn.functional.cross_entropy((x @ w.T).float(), labels), [x, w]))
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss()
        _emit(rows, "liger fused linear cross-entropy fwd+bwd", shape, _fwd_bwd(lambda: liger(w, x, labels), [x, w]))
    except ImportError as exc:
        rows.append({"name": "liger", "shape": shape, "error": str(exc)})
    try:
        from cut_cross_entropy import linear_cross_entropy

        _emit(rows, "cut cross-entropy fwd+bwd", shape,
              _fwd_bwd(lambda: linear_cross_entropy(x, w, labels), [x, w]))
    except ImportError as exc:
        rows.append({"name": "cut-cross-entropy", "shape": shape, "error": str(exc)})


def cross_entropy(rows: list[dict[str, Any]]) -> None:
    """Fused linear cross-entropy (Liger, Cut Cross-Entropy) and torch's unfused loss, T 16k, H 4096."""
    for vocab in (131072, 262144):
        _cross_entropy_vocab(rows, 16384, 4096, vocab)
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write every row as JSON lines here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("torch_baselines: no CUDA device", file=sys.stderr)
        return 2
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    rows: list[dict[str, Any]] = []
    cross_entropy(rows)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
