"""Baselines users compare ejk with, timed in torch on the GPU host: fla, Liger, Cut Cross-Entropy, torch.

Run with the host's own python3 (torch, triton) and the baseline wheels on ``PYTHONPATH``
(``flash-linear-attention``, ``fla-core``, ``liger-kernel``, ``cut-cross-entropy``). Prints one JSON
line per measurement (``name``, ``shape``, ``ms`` the median of CUDA-event timings, ``peak_gib`` the
extra device memory the call peaked at) and writes them all to ``--out``. Run it in its own process:
JAX and torch do not share a GPU allocator.

    python3 benchmarks/torch_baselines.py --out results.jsonl [--only fla|lce|all]
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


def _linear_attention_layout(rows: list[dict[str, Any]], label: str, b: int, t: int, cu: list[int] | None) -> None:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gla import chunk_gla
    from fla.ops.simple_gla import chunk_simple_gla

    dev, dt, heads, dk = "cuda", torch.bfloat16, 32, 128
    kw: dict[str, Any] = {} if cu is None else {"cu_seqlens": torch.tensor(cu, device=dev, dtype=torch.long)}

    def make(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=dt).requires_grad_()

    q, k, v = make(b, t, heads, dk), make(b, t, heads, dk), make(b, t, heads, dk)
    k_n = torch.nn.functional.normalize(k.detach().float(), dim=-1).to(dt).requires_grad_()
    g_scalar = (-torch.rand(b, t, heads, device=dev) * 0.1).requires_grad_()
    g_vec = (-torch.rand(b, t, heads, dk, device=dev) * 0.1).requires_grad_()
    beta = torch.rand(b, t, heads, device=dev, dtype=dt).requires_grad_()
    shape = f"{label} H{heads} K=V={dk}"
    cases: list[tuple[str, Callable[[], Any], list[torch.Tensor]]] = [
        ("fla gated_delta_rule", lambda: chunk_gated_delta_rule(q, k_n, v, g_scalar, beta, **kw),
         [q, k_n, v, g_scalar, beta]),
        ("fla gla", lambda: chunk_gla(q, k, v, g_vec, **kw), [q, k, v, g_vec]),
        ("fla simple_gla", lambda: chunk_simple_gla(q, k, v, g_scalar, **kw), [q, k, v, g_scalar]),
    ]
    for name, fn, inputs in cases:
        with torch.no_grad():
            _emit(rows, f"{name} fwd", shape, fn)
        _emit(rows, f"{name} fwd+bwd", shape, _fwd_bwd(fn, inputs))


def linear_attention(rows: list[dict[str, Any]]) -> None:
    """fla's chunked gated delta rule, GLA and simple GLA at Qwen3-Next-like sizes (32k tokens)."""
    for label, b, t, cu in (("B1xT32768", 1, 32768, None), ("B8xT4096", 8, 4096, None),
                            ("varlen 4k+8k+8k+12k", 1, 32768, [0, 4096, 12288, 20480, 32768])):
        _linear_attention_layout(rows, label, b, t, cu)
        torch.cuda.empty_cache()


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
    parser.add_argument("--only", choices=("all", "fla", "lce"), default="all")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("torch_baselines: no CUDA device", file=sys.stderr)
        return 2
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    rows: list[dict[str, Any]] = []
    if args.only in ("all", "fla"):
        linear_attention(rows)
        torch.cuda.empty_cache()
    if args.only in ("all", "lce"):
        cross_entropy(rows)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
