"""PyTorch's ``scaled_dot_product_attention`` as ``flash_attention`` baselines (when torch is importable).

torch is timed outside JAX: its lines skip ``jax.jit`` and run a plain Python callable that launches
the work on torch's current CUDA stream and returns a handle whose ``block_until_ready`` synchronises
(so :func:`ejk.config.tuning.measure` times it as it times a JAX executable: N calls back to back, one
synchronisation). The inputs are JAX's own buffers read through DLPack (no copy) and laid out as torch
users hold them, ``[B, H, S, D]`` contiguous (the transpose is made once, untimed); GQA passes
``enable_gqa=True``. Backward: ``torch.autograd.grad`` of the output for the case's cotangent.

Memory: JAX preallocates most of the GPU (``XLA_PYTHON_CLIENT_MEM_FRACTION``, default 0.75); torch gets
the rest for its outputs and gradients and gives its cached blocks back after each line
(``torch.cuda.empty_cache``), so the JAX lines that follow find the memory as before. A shape whose torch
line runs out of memory is reported ``oom``; lower ``XLA_PYTHON_CLIENT_MEM_FRACTION`` for it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import jax

from ejk.bench._cases import AttentionCase

__all__ = ["BACKENDS", "TorchCall", "torch_call", "torch_cuda_unsupported", "torch_sdpa", "torch_sdpa_unsupported"]

#: The baselines: their ``torch.nn.attention.SDPBackend`` member by line name.
BACKENDS = {"torch sdpa cudnn": "CUDNN_ATTENTION", "torch sdpa flash": "FLASH_ATTENTION"}


def _torch() -> Any:
    import torch

    return torch


def torch_cuda_unsupported() -> str | None:
    """Why a torch baseline cannot run here: JAX not on an NVIDIA GPU, torch not importable, or no CUDA device
    for torch (``None``: it can)."""
    if jax.default_backend() != "gpu":
        return "torch baselines run on an NVIDIA GPU (JAX's default backend here is not one)"
    try:
        torch = _torch()
    except Exception as exc:
        return f"torch is not importable ({type(exc).__name__}: {exc})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def torch_sdpa_unsupported(backend: str) -> Callable[[Any], str | None]:
    """Why the torch baseline ``backend`` cannot run a case here (``None``: it can)."""

    def unsupported(workload: Any) -> str | None:
        reason = torch_cuda_unsupported()
        if reason is not None:
            return reason
        torch = _torch()
        try:
            from torch.nn.attention import SDPBackend
        except Exception as exc:
            return f"torch {torch.__version__} has no torch.nn.attention ({type(exc).__name__}: {exc})"
        if not hasattr(SDPBackend, backend):
            return f"torch {torch.__version__} has no SDPBackend.{backend}"
        case = workload.case
        if isinstance(case, AttentionCase) and (case.window is not None or case.sinks):
            return "torch's scaled_dot_product_attention has no sliding window and no sinks"
        if isinstance(case, AttentionCase) and case.kv_heads != case.heads and not _has_gqa(torch):
            return f"torch {torch.__version__} has no enable_gqa (GQA needs torch >= 2.5)"
        return None

    return unsupported


def _has_gqa(torch: Any) -> bool:
    import inspect

    try:
        return "enable_gqa" in inspect.signature(torch.nn.functional.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # a builtin without a signature: torch >= 2.5 documents the argument
        return tuple(int(p) for p in torch.__version__.split(".")[:2] if p.isdigit()) >= (2, 5)


class TorchCall:
    """One torch line ready to time: calling it launches one forward (or forward + backward) and
    returns itself as the handle :func:`jax.block_until_ready` synchronises through."""

    def __init__(self, run: Callable[[], Any], torch: Any, to_jax: Callable[[Any], Any]) -> None:
        self._run, self._torch, self._to_jax = run, torch, to_jax
        self.last: Any = None

    def __call__(self) -> TorchCall:
        self.last = self._run()
        return self

    def block_until_ready(self) -> TorchCall:
        self._torch.cuda.synchronize()
        return self

    def to_jax(self) -> Any:
        """The last forward output as a JAX array in the op's layout (for the output check)."""
        return None if self.last is None else self._to_jax(self.last)

    def close(self) -> None:
        """Drop torch's tensors and give its cached blocks back (JAX's lines run next)."""
        self.last = self._run = None  # type: ignore[assignment]
        self._torch.cuda.synchronize()
        self._torch.cuda.empty_cache()


def torch_call(torch: Any, leaves: tuple[Any, ...], mode: str, grad_out: Any, forward: Callable[[], Any],
               to_jax: Callable[[Any], Any], *, triton_disk_cache: bool = False) -> TorchCall:
    """A :class:`TorchCall` of ``forward()`` (``mode`` ``"fwd"``: without autograd), or of ``forward()`` and
    ``torch.autograd.grad`` of its output for ``grad_out`` with respect to ``leaves`` (which require grad).

    ``triton_disk_cache``: the call runs Triton kernels that need Triton's disk cache (an autotuner that keeps
    its results there, as fla's does). jax-triton empties ``TRITON_CACHE_DIR`` when it is imported (it keeps
    its compiled kernels itself), which makes Triton refuse such calls ("Could not create or locate cache
    dir"); each run then sets it to a directory of its own and restores it after."""

    def run() -> Any:
        if mode == "fwd":
            with torch.no_grad():
                return forward()
        out = forward()
        torch.autograd.grad(out, leaves, grad_out)
        return out

    if not triton_disk_cache:
        return TorchCall(run, torch, to_jax)

    def run_with_cache_dir() -> Any:
        if os.environ.get("TRITON_CACHE_DIR") != "":
            return run()
        os.environ["TRITON_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), "ejk-bench-triton-cache")
        try:
            return run()
        finally:
            os.environ["TRITON_CACHE_DIR"] = ""

    return TorchCall(run_with_cache_dir, torch, to_jax)


def torch_sdpa(backend: str) -> Callable[[Any, tuple[Any, ...], str, Any], TorchCall]:
    """``build(workload, inputs, mode, cotangent)``: the torch line of SDPA backend ``backend``."""

    def build(workload: Any, inputs: tuple[Any, ...], mode: str, cotangent: Any) -> TorchCall:
        torch = _torch()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        case = workload.case
        assert isinstance(case, AttentionCase)
        gqa = {"enable_gqa": True} if case.kv_heads != case.heads else {}
        chosen = getattr(SDPBackend, backend)

        def heads_first(x: Any) -> Any:  # [B, S, H, D] (JAX, through DLPack) -> [B, H, S, D] contiguous
            return torch.from_dlpack(x).transpose(1, 2).contiguous()

        q, k, v = (heads_first(x).requires_grad_(mode != "fwd") for x in inputs)
        grad_out = heads_first(cotangent) if mode != "fwd" else None

        def forward() -> Any:
            with sdpa_kernel(chosen):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=case.causal, **gqa)

        def to_jax(out: Any) -> Any:
            from jax import dlpack

            return dlpack.from_dlpack(out.detach().transpose(1, 2).contiguous())

        return torch_call(torch, (q, k, v), mode, grad_out, forward, to_jax)

    return build
