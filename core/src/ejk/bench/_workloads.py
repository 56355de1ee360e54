"""What one case computes: its inputs, the public op call, and the work (FLOPs or bytes) it does.

FLOP counts (a multiply-add is 2 FLOPs):

- ``flash_attention``: ``4·B·Hq·Sq·Sk·D`` forward, halved when causal (the usual convention,
  the exact count is ``(S+1)/2S`` of the full one); forward + backward is 3.5x the forward
  (2 matmuls forward, 5 backward).
- ``ragged_paged_attention``: decode is memory bound, so GB/s of the KV cache read,
  ``2·Σ ctx·Hkv·D·itemsize``; chunked prefill counts exactly what each query sees,
  ``4·Hq·D·Σ_seq Σ_i (ctx − q + i + 1)``. Forward only (an inference op).
- ``grouped_matmul`` and ``matmul``: ``2·m·k·n``; forward + backward 3x.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk.bench._cases import AttentionCase, Case, MatmulCase, MoeCase, PagedCase

__all__ = ["MODES", "Workload", "dirichlet_sizes", "with_backward", "workload_for"]

MODES = ("fwd", "fwd+bwd")
TFLOPS, GBPS = "TFLOP/s", "GB/s"
#: Matmul-like ops run at the backend's fast precision, as ``a @ b`` does by default.
PRECISION = "default"
#: Concentration of the Dirichlet split of tokens over experts for skewed groups (seeded).
DIRICHLET_ALPHA = 1.0


def with_backward(fn: Callable[..., Any], diff: tuple[int, ...]) -> Callable[..., Any]:
    """``g(*args, ct) -> (out, grads)``: ``fn``'s output and its VJP for cotangent ``ct``
    with respect to the arguments at positions ``diff``, in one function."""

    def forward_backward(*args: Any) -> Any:
        *arrays, ct = args

        def of_diff(*values: Any) -> Any:
            merged = list(arrays)
            for i, value in zip(diff, values, strict=True):
                merged[i] = value
            return fn(*merged)

        out, vjp = jax.vjp(of_diff, *(arrays[i] for i in diff))
        return out, vjp(ct)

    return forward_backward


def _normal(key: jax.Array, shape: tuple[int, ...], dtype: Any, scale: float = 1.0) -> jax.Array:
    return (jax.random.normal(key, shape, jnp.float32) * scale).astype(dtype)


def dirichlet_sizes(rng: np.random.Generator, tokens: int, groups: int) -> np.ndarray:
    """A Dirichlet split of ``tokens`` into ``groups`` non-negative sizes summing to ``tokens``."""
    share = rng.dirichlet(np.full(groups, DIRICHLET_ALPHA)) * tokens
    sizes = np.floor(share).astype(np.int64)
    sizes[np.argsort(sizes - share)[: tokens - int(sizes.sum())]] += 1  # the largest fractional parts
    return sizes.astype(np.int32)


@attrs.frozen(kw_only=True)
class Workload:
    """One case at one dtype: inputs, the call of the public op, the work per mode.

    Attributes:
        case: The shape.
        dtype: Element type of the floating inputs.
    """

    case: Case
    dtype: np.dtype[Any] = attrs.field(converter=np.dtype)

    @property
    def op(self) -> str:
        return self.case.op

    #: The modes this op is measured in.
    modes: tuple[str, ...] = MODES
    #: Positions of the differentiable inputs.
    diff: tuple[int, ...] = ()

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        """The public op's positional array arguments (random, on the default device)."""
        raise NotImplementedError

    def kwargs(self) -> dict[str, Any]:
        """The public op's keyword arguments (besides ``platform`` and ``cfg``)."""
        return {}

    def out_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def work(self, mode: str) -> tuple[float, str]:
        """``(work, unit)``: FLOPs for TFLOP/s, bytes for GB/s."""
        raise NotImplementedError

    def cotangent(self, seed: int = 1) -> jax.Array:
        """A random cotangent of the output (the backward pass's input)."""
        return _normal(jax.random.key(seed), self.out_shape(), self.dtype)

    def call(self, *, platform: str = "auto", cfg: Any = None) -> Callable[..., Any]:
        """``f(*inputs)`` calling the public op with ``platform=`` and ``cfg=``."""
        import ejk

        function = getattr(ejk, self.op)
        kwargs = self.kwargs()

        def op_call(*arrays: Any) -> Any:
            return function(*arrays, **kwargs, platform=platform, cfg=cfg)

        return op_call


@attrs.frozen(kw_only=True)
class AttentionWorkload(Workload):
    case: AttentionCase
    diff: tuple[int, ...] = (0, 1, 2)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
        return (_normal(kq, (c.batch, c.seq, c.heads, c.dim), self.dtype),
                _normal(kk, (c.batch, c.seq, c.kv_heads, c.dim), self.dtype),
                _normal(kv, (c.batch, c.seq, c.kv_heads, c.dim), self.dtype))

    def kwargs(self) -> dict[str, Any]:
        return {"causal": self.case.causal}

    def out_shape(self) -> tuple[int, ...]:
        c = self.case
        return (c.batch, c.seq, c.heads, c.dim)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        flops = 4.0 * c.batch * c.heads * c.seq * c.seq * c.dim / (2 if c.causal else 1)
        return flops * (3.5 if mode == "fwd+bwd" else 1.0), TFLOPS


@attrs.frozen(kw_only=True)
class PagedWorkload(Workload):
    case: PagedCase
    modes: tuple[str, ...] = ("fwd",)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        per_seq = -(-c.ctx // c.page)
        pages = c.seqs * per_seq
        kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
        rng = np.random.default_rng(seed)
        table = rng.permutation(pages).reshape(c.seqs, per_seq).astype(np.int32)  # scattered pages
        return (_normal(kq, (c.seqs * c.q_len, c.hq, c.dim), self.dtype),
                _normal(kk, (pages, c.page, c.hkv, c.dim), self.dtype),
                _normal(kv, (pages, c.page, c.hkv, c.dim), self.dtype),
                jnp.full((c.seqs,), c.ctx, jnp.int32), jnp.asarray(table),
                jnp.arange(c.seqs + 1, dtype=jnp.int32) * c.q_len, jnp.int32(c.seqs))

    def out_shape(self) -> tuple[int, ...]:
        c = self.case
        return (c.seqs * c.q_len, c.hq, c.dim)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        if c.decode:
            return 2.0 * c.seqs * c.ctx * c.hkv * c.dim * self.dtype.itemsize, GBPS
        visible = c.q_len * (c.ctx - c.q_len) + c.q_len * (c.q_len + 1) / 2
        return 4.0 * c.hq * c.dim * c.seqs * visible, TFLOPS


@attrs.frozen(kw_only=True)
class MoeWorkload(Workload):
    case: MoeCase
    diff: tuple[int, ...] = (0, 1)

    def group_sizes(self, seed: int = 0) -> np.ndarray:
        c = self.case
        if c.skewed:
            return dirichlet_sizes(np.random.default_rng(seed), c.tokens, c.experts)
        sizes = np.full(c.experts, c.tokens // c.experts, np.int32)
        sizes[: c.tokens - int(sizes.sum())] += 1
        return sizes

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        kl, kr = jax.random.split(jax.random.key(seed))
        return (_normal(kl, (c.tokens, c.k), self.dtype),
                _normal(kr, (c.experts, c.k, c.n), self.dtype, 1 / math.sqrt(c.k)),
                jnp.asarray(self.group_sizes(seed)))

    def kwargs(self) -> dict[str, Any]:
        return {"precision": PRECISION}

    def out_shape(self) -> tuple[int, ...]:
        return (self.case.tokens, self.case.n)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        return 2.0 * c.tokens * c.k * c.n * (3.0 if mode == "fwd+bwd" else 1.0), TFLOPS


@attrs.frozen(kw_only=True)
class MatmulWorkload(Workload):
    case: MatmulCase
    diff: tuple[int, ...] = (0, 1)

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        c = self.case
        ka, kb = jax.random.split(jax.random.key(seed))
        return (_normal(ka, (c.m, c.k), self.dtype), _normal(kb, (c.k, c.n), self.dtype, 1 / math.sqrt(c.k)))

    def kwargs(self) -> dict[str, Any]:
        return {"precision": PRECISION}

    def out_shape(self) -> tuple[int, ...]:
        return (self.case.m, self.case.n)

    def work(self, mode: str) -> tuple[float, str]:
        c = self.case
        return 2.0 * c.m * c.k * c.n * (3.0 if mode == "fwd+bwd" else 1.0), TFLOPS


_WORKLOADS: dict[str, type[Workload]] = {
    "flash_attention": AttentionWorkload, "ragged_paged_attention": PagedWorkload,
    "grouped_matmul": MoeWorkload, "matmul": MatmulWorkload,
}


def workload_for(case: Case, dtype: Any) -> Workload:
    """The workload of ``case`` at ``dtype``."""
    return _WORKLOADS[case.op](case=case, dtype=dtype)
