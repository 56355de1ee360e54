"""flash-linear-attention (fla) as baselines of the recurrent ops (when fla and torch are importable).

fla's chunked Triton kernels on torch are what users of linear attention compare with:
``chunk_gated_delta_rule`` for ``gated_delta_rule``, ``chunk_gla`` for ``gla``, and ``chunk_simple_gla`` for
``ssd``. The Mamba-2 SSD is a scalar-decay linear attention with ``q = C``, ``k = B``, ``v = dt·x``,
``g = dt·A`` and scale 1. The mapping is made once, untimed: ``dt`` through its softplus and bias, the ``G``
groups of ``B`` and ``C`` repeated per head. The timed call is fla's kernel alone, so its gradients are those
of the mapped tensors. The ``D·x`` skip term is added after timing, for the output check.

The lines are timed as the torch SDPA ones are (``ejk.bench._torch``). Inputs are JAX's buffers read through
DLPack, already in fla's ``[B, T, H, D]`` layout; packed cases pass fla their offsets. fla refuses some kernels
on some Triton versions: its gated backward (gated delta rule, GLA, simple GLA) needs Triton >= 3.7.1 on
Hopper (fla issue #640). Such a line fails with fla's own message, and the other lines run; to time fla's lines
on another Triton, run them in a process of their own (``--impl none --baseline fla``) with that Triton first in
``PYTHONPATH`` (``benchmarks/pack_triton_for_fla.sh`` packs one for the GPU host).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ejk.bench._baselines import Baseline, Prepared, register_baseline
from ejk.bench._torch import TorchCall, _torch, torch_call, torch_cuda_unsupported
from ejk.bench._workloads import Workload

__all__ = ["FLA_KERNELS"]

#: The fla function each op's line times, by op.
FLA_KERNELS = {"gated_delta_rule": "fla.ops.gated_delta_rule.chunk_gated_delta_rule",
               "gla": "fla.ops.gla.chunk_gla", "ssd": "fla.ops.simple_gla.chunk_simple_gla"}


def _kernel(op: str) -> Any:
    module, _, name = FLA_KERNELS[op].rpartition(".")
    return getattr(importlib.import_module(module), name)


def _unsupported(op: str) -> Callable[[Workload], str | None]:
    def unsupported(workload: Workload) -> str | None:
        reason = torch_cuda_unsupported()
        if reason is not None:
            return reason
        try:
            _kernel(op)
        except Exception as exc:
            return (f"fla is not importable ({type(exc).__name__}: {exc}); "
                    "pip install flash-linear-attention fla-core")
        return None

    return unsupported


def _ssd_as_simple_gla(inputs: tuple[Any, ...], options: dict[str, Any]) -> tuple[tuple[Any, ...], Any]:
    """``(q, k, v, g)`` of the simple GLA that computes the SSD's ``y − D·x``, and ``D·x`` (float32), from the
    case's arrays and keyword arguments."""
    x, dt, a, b, c = inputs
    step = dt.astype(jnp.float32) + options.get("dt_bias", 0.0)
    if options.get("dt_softplus", False):
        step = jax.nn.softplus(step)
    heads = x.shape[2] // b.shape[2]
    q, k = (jnp.repeat(m, heads, axis=2) for m in (c, b))
    v = (x.astype(jnp.float32) * step[..., None]).astype(x.dtype)
    skip = options.get("D")
    return (q, k, v, step * a), None if skip is None else skip[:, None] * x.astype(jnp.float32)


def _line(op: str) -> Callable[[Workload, tuple[Any, ...]], Prepared]:
    def build(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
        def not_jax(*_: Any) -> Any:
            raise RuntimeError("an fla baseline runs outside JAX")

        return Prepared(fn=not_jax, args=inputs, diff=workload.diff,
                        external=lambda mode, cotangent: _call(op, workload, inputs, mode, cotangent))

    return build


def _call(op: str, workload: Workload, inputs: tuple[Any, ...], mode: str, cotangent: Any) -> TorchCall:
    torch = _torch()
    kernel = _kernel(op)
    options = workload.kwargs()
    skip = None
    if op == "ssd":
        inputs, skip = _ssd_as_simple_gla(inputs, options)
    tensors = [torch.from_dlpack(jnp.asarray(x)).contiguous() for x in inputs]
    if mode != "fwd":
        tensors = [t.requires_grad_(True) for t in tensors]
    grad_out = torch.from_dlpack(cotangent).contiguous() if mode != "fwd" else None
    extra: dict[str, Any] = {}
    offsets = options.get("cu_seqlens")
    if offsets is not None:
        extra["cu_seqlens"] = torch.from_dlpack(offsets).long()
    if op == "gated_delta_rule":
        extra["use_qk_l2norm_in_kernel"] = bool(options.get("use_qk_l2norm", False))
    if op == "ssd":
        extra["scale"] = 1.0

    def forward() -> Any:
        return kernel(*tensors, **extra)[0]

    def to_jax(out: Any) -> Any:
        from jax import dlpack

        got = dlpack.from_dlpack(out.detach().contiguous())
        return got if skip is None else (got.astype(jnp.float32) + skip).astype(got.dtype)

    return torch_call(torch, tuple(tensors), mode, grad_out, forward, to_jax, triton_disk_cache=True)


_NOTES = {
    "gated_delta_rule": "fla chunk_gated_delta_rule (Triton on torch), the case's l2 norm in its kernel",
    "gla": "fla chunk_gla (Triton on torch)",
    "ssd": "fla chunk_simple_gla (Triton on torch) on the SSD mapped to it (q = C, k = B, v = dt·x, g = dt·A, "
           "scale 1; the mapping untimed), the issue's same-size scalar-decay kernel",
}
for _op, _path in FLA_KERNELS.items():
    register_baseline(Baseline(name=f"fla {_path.rpartition('.')[2]}", op=_op, build=_line(_op),
                               unsupported=_unsupported(_op), note=_NOTES[_op]))
