"""Problem builders shared by the test suites of ejk and its plugins: attention cases with their
inputs, paged batches, and a cheaply compiled ``jax.jit`` for the many small programs tests build."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["FAST_COMPILE", "AttentionCase", "attention_values_and_grads", "fast_jit", "paged_batch"]

#: XLA options that make a CPU compile cheap (tests compile many small programs; the code is not timed).
FAST_COMPILE: dict[str, Any] = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def jaxpr_equations(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``, e.g. from ``jax.make_jaxpr``), those of the
    jaxprs nested in its equations' parameters (``shard_map`` bodies, ``cond`` branches, custom VJPs…) included,
    each after the equation that holds it: for tests that check what a traced program contains."""
    import jax.extend

    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from jaxpr_equations(sub)


def fast_jit(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """``jax.jit(fn, **kwargs)``, compiled with :data:`FAST_COMPILE` where JAX's default backend is
    the CPU (elsewhere with the default options)."""
    options = FAST_COMPILE if jax.default_backend() == "cpu" else None
    return jax.jit(fn, compiler_options=options, **kwargs)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """Standard normal values drawn on the host: no compilation per shape (``jax.random`` compiles one)."""
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32).astype(jnp.dtype(dtype)))


@attrs.frozen(kw_only=True)
class AttentionCase:
    """One flash-attention problem: ``q [b, sq, hq, d]``, ``k [b, sk, hkv, d]``, ``v [b, sk, hkv, dv]``.

    A plugin's tests subclass it to add their block sizes (and a ``cfg`` property), redefining
    defaults where they differ; :meth:`label_parts` extends the test id.

    Attributes:
        dv: Head dim of ``v`` (default ``d``).
        window: ``sliding_window``; ``cap``: ``logits_soft_cap``.
        seg: Random segment ids, with query rows whose id no key has (rows that see nothing).
        bias: A 4-letter pattern over ``B H Q K``: the letter for a full dimension, ``1`` for a
            broadcast one (``"1HQK"``); the bias is float32.
        dtype: Of q, k, v (a NumPy / JAX dtype name).
    """

    b: int = 1
    sq: int = 16
    sk: int = 16
    hq: int = 2
    hkv: int = 2
    d: int = 16
    dv: int | None = None
    causal: bool = False
    window: int | tuple[int, int] | None = None
    cap: float | None = None
    seg: bool = False
    bias: str | None = None
    dtype: str = "float32"

    def label_parts(self) -> list[str]:
        """The pieces of the test id (``str(case)`` joins them with ``-``)."""
        parts = [f"b{self.b}q{self.sq}k{self.sk}h{self.hq}/{self.hkv}d{self.d}", self.dtype]
        parts += [f"dv{self.dv}"] * (self.dv is not None) + ["causal"] * self.causal
        parts += [f"win{self.window}"] * (self.window is not None) + [f"cap{self.cap}"] * (self.cap is not None)
        return parts + ["seg"] * self.seg + [f"bias{self.bias}"] * bool(self.bias)

    def __str__(self) -> str:
        return "-".join(self.label_parts())

    def options(self) -> dict[str, Any]:
        """The case's static options as ``flash_attention`` keyword arguments."""
        return {"causal": self.causal, "sliding_window": self.window, "logits_soft_cap": self.cap}

    def inputs(self, seed: int = 0) -> dict[str, Any]:
        """Random inputs as ``flash_attention`` keyword arguments: q, k, v, the segment ids and bias
        (``None`` where the case has none)."""
        rng = np.random.default_rng(seed)
        q = _normal(rng, (self.b, self.sq, self.hq, self.d), self.dtype)
        k = _normal(rng, (self.b, self.sk, self.hkv, self.d), self.dtype)
        v = _normal(rng, (self.b, self.sk, self.hkv, self.dv or self.d), self.dtype)
        q_seg = kv_seg = bias = None
        if self.seg:  # ids 0..3 for queries, 0..2 for keys: rows with id 3 see no key
            q_seg = jnp.asarray(rng.integers(0, 4, (self.b, self.sq), dtype=np.int32))
            kv_seg = jnp.asarray(rng.integers(0, 3, (self.b, self.sk), dtype=np.int32))
        if self.bias:
            full = (self.b, self.hq, self.sq, self.sk)
            bias = _normal(rng, tuple(1 if c == "1" else n for c, n in zip(self.bias, full, strict=True)),
                           np.float32)
        return {"q": q, "k": k, "v": v, "q_segment_ids": q_seg, "kv_segment_ids": kv_seg, "bias": bias}

    def cotangent(self, seed: int = 99) -> jax.Array:
        """A random cotangent of the output ``[b, sq, hq, dv]``."""
        return _normal(np.random.default_rng(seed), (self.b, self.sq, self.hq, self.dv or self.d), self.dtype)


def values_and_grads(fn: Callable[..., Any], args: tuple[Any, ...], *, cotangent: Any = None, seed: int = 7,
                     jit: Callable[..., Any] = fast_jit) -> tuple[Any, Any]:
    """``fn(*args)`` and the gradients of ``<out, cotangent>`` with respect to every argument, computed in one
    ``jit``-compiled program. ``cotangent`` defaults to standard normal values drawn from ``seed``, shaped and
    typed like the output (so two functions called with the same ``seed`` see the same cotangent).

    Returns:
        ``(out, (d arg0, d arg1, ...))``.
    """
    if cotangent is None:
        out = jax.eval_shape(fn, *args)
        cotangent = _normal(np.random.default_rng(seed), out.shape, out.dtype)

    def run(*xs: Any) -> Any:
        y, vjp = jax.vjp(fn, *xs)
        return y, vjp(cotangent)

    return jit(run)(*args)  # type: ignore[no-any-return]


def attention_values_and_grads(fn: Callable[..., Any], inputs: dict[str, Any], cotangent: jax.Array, *,
                               jit: Callable[..., Any] = fast_jit) -> tuple[jax.Array, dict[str, Any]]:
    """``fn(**inputs)`` and the gradients of ``<out, cotangent>`` with respect to q, k, v and bias
    (those that are not ``None``), computed in one ``jit``-compiled program.

    Returns:
        ``(out, {"q": dq, "k": dk, "v": dv[, "bias": dbias]})``.
    """
    diff = {n: inputs[n] for n in ("q", "k", "v", "bias") if inputs.get(n) is not None}
    rest = {n: x for n, x in inputs.items() if n not in diff}

    def run(diff: dict[str, Any], rest: dict[str, Any]) -> Any:
        out, vjp = jax.vjp(lambda d: fn(**d, **rest), diff)
        return out, vjp(cotangent)[0]

    out, grads = jit(run)(diff, rest)
    return out, grads


def paged_batch(
    seed: int = 0,
    *,
    q_lens: Sequence[int] = (3, 1, 5),
    kv_lens: Sequence[int] = (9, 4, 12),
    num_seqs: int | None = None,
    page: int = 4,
    pages_per_seq: int | None = None,
    spare_pages: int = 0,
    hq: int = 4,
    hkv: int = 2,
    d: int = 16,
    dtype: Any = jnp.float32,
) -> list[Any]:
    """The positional arguments of ``ragged_paged_attention``: sequences over shuffled pages.

    Each sequence owns ``pages_per_seq`` pages (default: the fewest its longest context needs) of a
    cache of ``len(kv_lens) * pages_per_seq + spare_pages`` pages, in random order; ``num_seqs``
    (default: every sequence) is a Python int, the sequences past it are padding.

    Returns:
        ``[q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs]``.
    """
    rng = np.random.default_rng(seed)
    seqs = len(kv_lens)
    per_seq = pages_per_seq or max(-(-n // page) for n in kv_lens)
    table = rng.permutation(seqs * per_seq + spare_pages)[: seqs * per_seq].reshape(seqs, per_seq)
    pages = seqs * per_seq + spare_pages
    return [jnp.asarray(rng.standard_normal((sum(q_lens), hq, d)), dtype),
            jnp.asarray(rng.standard_normal((pages, page, hkv, d)), dtype),
            jnp.asarray(rng.standard_normal((pages, page, hkv, d)), dtype),
            jnp.asarray(kv_lens, jnp.int32), jnp.asarray(table, jnp.int32),
            jnp.asarray(np.cumsum([0, *q_lens]), jnp.int32), seqs if num_seqs is None else num_seqs]
