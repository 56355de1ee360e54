"""The ``ssd`` baseline of ``ejk bench``: the Mamba-2 chunked algorithm in plain ``jax.numpy``, laid out
as the Mamba-2 paper writes it (no ejk code).

Per chunk of ``L`` tokens: the diagonal blocks ``(C Bᵀ ⊙ exp(segsum(a))) (dt·x)``, the states each chunk
adds, the states between chunks from ``exp(segsum)`` of the chunks' total decays (a ``[chunks, chunks]``
matrix per head, as the paper does; fine at 32k tokens / 256), and the off-diagonal outputs. Heads read
their group's ``B`` / ``C`` repeated per head. Batch layouts only (packed sequences are ejk's).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ejk.bench._baselines import Baseline, Prepared, register_baseline
from ejk.bench._workloads import Workload

__all__ = ["PAPER_CHUNK", "mamba2_chunked"]

#: The chunk length of the paper's reference setting.
PAPER_CHUNK = 256


def _segsum(a: jax.Array) -> jax.Array:
    """``[..., L] -> [..., L, L]``: ``Σ_{j<r<=i} a_r`` below the diagonal, ``-inf`` above."""
    size = a.shape[-1]
    cum = jnp.cumsum(a, axis=-1)
    diff = cum[..., :, None] - cum[..., None, :]
    return jnp.where(jnp.tril(jnp.ones((size, size), bool)), diff, -jnp.inf)


def mamba2_chunked(x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array,  # noqa: N803
                   D: jax.Array, dt_bias: jax.Array, chunk: int = PAPER_CHUNK) -> jax.Array:  # noqa: N803
    """``y`` of ``ejk.ssd(x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=True)`` with zero initial states,
    for ``T`` a multiple of ``chunk``."""
    b, t, h, p = x.shape
    heads = h // B.shape[2]
    f32 = jnp.float32
    step = jax.nn.softplus(dt.astype(f32) + dt_bias)
    xs = (x.astype(f32) * step[..., None]).reshape(b, t // chunk, chunk, h, p)
    a = jnp.moveaxis((step * A).reshape(b, t // chunk, chunk, h), -1, 1)  # [b, h, c, l]
    bs, cs = (jnp.repeat(m.astype(f32), heads, axis=2).reshape(b, t // chunk, chunk, h, -1) for m in (B, C))
    a_cum = jnp.cumsum(a, axis=-1)
    y_diag = jnp.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", cs, bs, jnp.exp(_segsum(a)), xs)
    decay_out = jnp.exp(a_cum[..., -1:] - a_cum)
    states = jnp.einsum("bclhn,bhcl,bclhp->bchpn", bs, decay_out, xs)
    states = jnp.concatenate([jnp.zeros_like(states[:, :1]), states], axis=1)
    chunk_decay = jnp.exp(_segsum(jnp.pad(a_cum[..., -1], ((0, 0), (0, 0), (1, 0)))))
    entering = jnp.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)[:, :-1]
    y_off = jnp.einsum("bclhn,bchpn,bhcl->bclhp", cs, entering, jnp.exp(a_cum))
    y = (y_diag + y_off).reshape(b, t, h, p) + D[:, None] * x.astype(f32)
    return y.astype(x.dtype)


def _build(workload: Workload, inputs: tuple[Any, ...]) -> Prepared:
    options = workload.kwargs()
    d, bias = options["D"], options["dt_bias"]

    def fn(x: jax.Array, dt: jax.Array, a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
        return mamba2_chunked(x, dt, a, b, c, d, bias)

    return Prepared(fn=fn, args=inputs, diff=(0, 1, 2, 3, 4))


def _unsupported(workload: Workload) -> str | None:
    case: Any = workload.case
    if case.packed:
        return "the paper's chunked layout has no packed sequences"
    if case.seq % PAPER_CHUNK:
        return f"sequences of {case.seq} tokens are not a multiple of the chunk {PAPER_CHUNK}"
    return None


register_baseline(Baseline(name="mamba2 chunked (jnp)", op="ssd", build=_build, unsupported=_unsupported,
                           note="the Mamba-2 paper's chunked SSD in plain jax.numpy, chunks of 256"))
