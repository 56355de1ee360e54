"""The public operations inside `shard_map` (two CPU devices, in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CODE = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import ejk
    from ejk.testing import (assert_close, reference_flash_attention, reference_grouped_matmul,
                             reference_ragged_paged_attention)

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        from jax.experimental.shard_map import shard_map
    mesh = Mesh(np.array(jax.devices()[:2]), ("batch",))
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (4, 64, 4, 16))
    k = jax.random.normal(keys[1], (4, 48, 2, 16))
    v = jax.random.normal(keys[2], (4, 48, 2, 16))

    def local(q, k, v):
        return ejk.flash_attention(q, k, v, causal=True)

    spec = P("batch", None, None, None)
    sharded = jax.jit(shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec))
    out = sharded(q, k, v)
    assert_close(out, reference_flash_attention(q, k, v, causal=True), jnp.float32)

    grad = jax.jit(jax.grad(lambda q: sharded(q, k, v).sum()))(q)
    want = jax.grad(lambda q: reference_flash_attention(q, k, v, causal=True).sum())(q)
    assert_close(grad, want, jnp.float32, what="dq")

    a = jax.random.normal(keys[0], (4, 8, 16))
    b = jax.random.normal(keys[1], (16, 8))
    mm = jax.jit(shard_map(lambda a: ejk.matmul(a, b), mesh=mesh, in_specs=(P("batch"),), out_specs=P("batch")))
    assert_close(mm(a), a @ b, jnp.float32, kind="matmul")
    # Grouped matmul, column-parallel: rhs and the output are split along n.
    lhs = jax.random.normal(keys[0], (24, 16))
    rhs = jax.random.normal(keys[1], (3, 16, 8))
    sizes = jnp.array([10, 0, 9], jnp.int32)
    gmm = jax.jit(shard_map(lambda lhs, rhs, sizes: ejk.grouped_matmul(lhs, rhs, sizes), mesh=mesh,
                            in_specs=(P(), P(None, None, "batch"), P()), out_specs=P(None, "batch")))
    assert_close(gmm(lhs, rhs, sizes), reference_grouped_matmul(lhs, rhs, sizes), jnp.float32, kind="matmul")

    # Paged attention, head-parallel: q heads and kv heads are split.
    rng = np.random.default_rng(0)
    k_pages = jnp.asarray(rng.standard_normal((8, 4, 2, 16)), jnp.float32)
    v_pages = jnp.asarray(rng.standard_normal((8, 4, 2, 16)), jnp.float32)
    kv_lens = jnp.array([7, 13], jnp.int32)
    table = jnp.asarray(rng.permutation(8).reshape(2, 4), jnp.int32)
    cu = jnp.array([0, 2, 5], jnp.int32)
    qp = jnp.asarray(rng.standard_normal((5, 4, 16)), jnp.float32)
    heads = P(None, "batch", None)
    pages = P(None, None, "batch", None)
    rpa = jax.jit(shard_map(
        lambda q, kp, vp, lens, table, cu: ejk.ragged_paged_attention(q, kp, vp, lens, table, cu, 2),
        mesh=mesh, in_specs=(heads, pages, pages, P(), P(), P()), out_specs=heads))
    want = reference_ragged_paged_attention(qp, k_pages, v_pages, kv_lens, table, cu, 2)
    assert_close(rpa(qp, k_pages, v_pages, kv_lens, table, cu), want, jnp.float32, kind="paged")
    print("ok", len(jax.devices()))
    """
)


def test_ops_compose_with_shard_map() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok 2")
