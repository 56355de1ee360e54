"""The public operations on an NVIDIA GPU (marker `gpu`; run by `nox -s gpu` on the GPU host)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import (
    assert_close,
    reference_flash_attention,
    reference_grouped_matmul,
    reference_ragged_paged_attention,
    values_and_grads,
)

pytestmark = pytest.mark.gpu

#: ejk.testing's comparison with the GPU rows of its tolerance table (float32 dots are TF32-class).
close = functools.partial(assert_close, kind="gpu")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_forward_and_grads_on_gpu(dtype: Any, causal: bool) -> None:
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (2, 384, 8, 128), dtype)
    k = jax.random.normal(keys[1], (2, 512, 2, 128), dtype)
    v = jax.random.normal(keys[2], (2, 512, 2, 128), dtype)
    do = jax.random.normal(keys[3], (2, 384, 8, 128), dtype)
    # One jitted program each (values_and_grads): eager vjps compile every primitive on its own.
    out, grads = values_and_grads(lambda q, k, v: ejk.flash_attention(q, k, v, causal=causal, platform="xla"),
                                  (q, k, v), cotangent=do)
    ref, ref_grads = values_and_grads(lambda q, k, v: reference_flash_attention(q, k, v, causal=causal), (q, k, v),
                                      cotangent=do)
    close(out, ref, dtype)
    for name, got, want in zip("qkv", grads, ref_grads, strict=True):
        close(got, want, dtype, what=f"d{name}")  # relative to the largest gradient, as assert_close scales


def test_autotuning_on_gpu_persists(tmp_path: Path) -> None:
    events: list[ejk.SelectionEvent] = []
    chain = ejk.ConfigSelectorChain(policy=ejk.AutotunePolicy(autotune=True), on_event=events.append,
                                    persistent_dir=tmp_path)
    q = jax.random.normal(jax.random.key(1), (1, 2048, 8, 128), jnp.bfloat16)
    with ejk.use_executor(ejk.Executor(chain)):
        out = ejk.flash_attention(q, q, q, causal=True)
    close(out, reference_flash_attention(q, q, q, causal=True), jnp.bfloat16)
    (event,) = events
    assert event.tier == "autotune" and event.device.startswith("gpu|")
    assert event.tune is not None and sum(t.error is None for t in event.tune.trials) >= 2
    assert (tmp_path / "flash_attention.json").exists()


def test_grouped_matmul_and_paged_attention_on_gpu() -> None:
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal((1000, 256)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((8, 256, 128)), jnp.bfloat16)
    sizes = jnp.array([100, 0, 300, 50, 250, 0, 200, 60], jnp.int32)
    close(ejk.grouped_matmul(lhs, rhs, sizes), reference_grouped_matmul(lhs, rhs, sizes), jnp.bfloat16)

    pages, page, kv_heads, dim = 64, 16, 2, 128
    k_pages = jnp.asarray(rng.standard_normal((pages, page, kv_heads, dim)), jnp.bfloat16)
    v_pages = jnp.asarray(rng.standard_normal((pages, page, kv_heads, dim)), jnp.bfloat16)
    kv_lens = jnp.array([100, 37, 256, 1], jnp.int32)
    page_indices = jnp.asarray(rng.permutation(pages).reshape(4, 16), jnp.int32)
    cu_q_lens = jnp.array([0, 1, 9, 10, 11], jnp.int32)
    q = jnp.asarray(rng.standard_normal((11, 8, dim)), jnp.bfloat16)
    args = (q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, 4)
    close(ejk.ragged_paged_attention(*args), reference_ragged_paged_attention(*args), jnp.bfloat16)


@pytest.mark.parametrize("layout", ["experts", "experts+rows", "rows"])
def test_sharded_grouped_matmul_on_gpus(layout: str) -> None:
    """Every visible GPU (at least two): grouped matmul split by experts (psum / reduce-scatter) or
    rows under jit, bfloat16 with uneven and empty groups, forward and gradients as on one device."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    n = len(jax.devices())
    if n < 2:
        pytest.skip(f"needs two GPUs, found {n}")
    experts, m = 8 * n, 1024 * n
    keys = jax.random.split(jax.random.key(0), 3)
    lhs = jax.random.normal(keys[0], (m, 256), jnp.bfloat16)
    rhs = (jax.random.normal(keys[1], (experts, 256, 384), jnp.float32) / 16).astype(jnp.bfloat16)
    sizes = np.random.default_rng(0).multinomial(m - 37, np.random.default_rng(1).dirichlet(np.ones(experts)))
    sizes[::5] = 0  # empty groups; the rest keep their (uneven) rows, rows past the sum are zeros
    sizes = jnp.asarray(sizes, jnp.int32)
    weight = jax.random.normal(keys[2], (m, 384), jnp.float32)
    loss = lambda f: lambda x, w: (f(x, w, sizes).astype(jnp.float32) * weight).sum()  # noqa: E731
    specs = {"experts": (P(), P("e")), "experts+rows": (P("e"), P("e")), "rows": (P("e"), P())}[layout]
    mesh = jax.make_mesh((n,), ("e",), axis_types=(AxisType.Explicit,))
    want = ejk.grouped_matmul(lhs, rhs, sizes)
    want_grads = jax.grad(loss(ejk.grouped_matmul), argnums=(0, 1))(lhs, rhs)
    with jax.set_mesh(mesh):
        x, w = (jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((lhs, rhs), specs, strict=True))
        out = jax.jit(ejk.grouped_matmul)(x, w, sizes)
        grads = jax.jit(jax.grad(loss(ejk.grouped_matmul), argnums=(0, 1)))(x, w)
    close(out, reference_grouped_matmul(lhs, rhs, sizes), jnp.bfloat16)
    close(out, want, jnp.bfloat16, what="output vs one device")
    for name, got, ref in zip(("dlhs", "drhs"), grads, want_grads, strict=True):
        close(got, ref, jnp.bfloat16, what=name)
