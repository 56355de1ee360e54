"""The public ops on sharded inputs without ``shard_map``: one call per shard, results as unsharded.

Runs in a fresh interpreter with four CPU devices. Under ``jax.jit`` shardings are visible for
``Explicit`` mesh axes; eager calls see the arrays' own shardings (``Auto`` axes too). The
recorded invocations show the Executor chose configs for per-shard shapes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CODE = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import ejk
    from ejk.invocations import clear_invocations, get_invocations
    from ejk.testing import (reference_flash_attention, reference_grouped_matmul,
                             reference_ragged_paged_attention)

    def shapes(op):
        calls = get_invocations(ejk.device_fingerprint())
        return {tuple(args[0].shape) for name, found in calls.items() if name.split("@")[0] == op
                for _, args, _ in found.values()}

    def close(a, b, tol=2e-5):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=tol)

    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (4, 16, 4, 8))
    k = jax.random.normal(keys[1], (4, 16, 2, 8))
    v = jax.random.normal(keys[2], (4, 16, 2, 8))
    kv1 = k[:, :, :1]  # multi-query: one kv head, q heads still split
    want = reference_flash_attention(q, k, v, causal=True)

    # 2-D mesh, explicit axes: batch over "data", heads over "model", under jit, forward and gradients.
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))
    with jax.set_mesh(mesh):
        qs, ks, vs = (put(x, "data", None, "model") for x in (q, k, v))
        clear_invocations()
        out = jax.jit(lambda q, k, v: ejk.flash_attention(q, k, v, causal=True))(qs, ks, vs)
        assert out.sharding.spec == P("data", None, "model", None), out.sharding
        close(out, want)
        assert shapes("flash_attention") == {(2, 16, 2, 8)}, shapes("flash_attention")
        loss = lambda f: lambda q, k, v: (f(q, k, v, causal=True) * jnp.cos(q)).sum()
        got = jax.jit(jax.grad(loss(ejk.flash_attention), argnums=(0, 1, 2)))(qs, ks, vs)
        ref = jax.grad(loss(reference_flash_attention), argnums=(0, 1, 2))(q, k, v)
        for a, b in zip(got, ref):
            close(a, b, 1e-4)
        # Multi-query: kv replicated, q heads split.
        out = jax.jit(lambda q, k, v: ejk.flash_attention(q, k, v))(qs, put(kv1, "data"), put(kv1, "data"))
        close(out, reference_flash_attention(q, kv1, kv1))
        # flash_attention_lse splits its lse output the same way.
        o, lse = jax.jit(lambda q, k, v: ejk.flash_attention_lse(q, k, v))(qs, ks, vs)
        assert lse.sharding.spec == P("data", "model", None), lse.sharding
        close(lse, ejk.testing.reference_flash_attention_lse(q, k, v)[1])
        # matmul: rows of a over "data", columns of b over "model".
        a = jax.random.normal(keys[3], (8, 6, 16))
        b = jax.random.normal(keys[0], (16, 4))
        clear_invocations()
        out = jax.jit(ejk.matmul)(put(a, None, "data"), put(b, None, "model"))
        assert out.sharding.spec == P(None, "data", "model"), out.sharding
        close(out, jnp.matmul(a, b, precision="highest"), 1e-4)
        assert shapes("matmul") == {(8, 3, 16)}, shapes("matmul")
        # grouped matmul, column-parallel.
        lhs = jax.random.normal(keys[1], (24, 16))
        rhs = jax.random.normal(keys[2], (3, 16, 8))
        sizes = jnp.array([10, 0, 9], jnp.int32)
        out = jax.jit(ejk.grouped_matmul)(lhs, put(rhs, None, None, "model"), sizes)
        close(out, reference_grouped_matmul(lhs, rhs, sizes), 1e-4)
        # A sequence-sharded q is not split (that is ring attention's job): same result, whole shapes.
        clear_invocations()
        out = jax.jit(lambda q, k, v: ejk.flash_attention(q, k, v, causal=True))(put(q, None, "data"), k, v)
        close(out, want)
        assert shapes("flash_attention") == {(4, 16, 4, 8)}

    # 1-D mesh of four, auto axes, eager call on committed arrays: heads over "x" (paged attention).
    mesh1 = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Auto,))
    rng = np.random.default_rng(0)
    qp = jnp.asarray(rng.standard_normal((5, 8, 16)), jnp.float32)
    kp = jnp.asarray(rng.standard_normal((8, 4, 4, 16)), jnp.float32)
    vp = jnp.asarray(rng.standard_normal((8, 4, 4, 16)), jnp.float32)
    lens, cu = jnp.array([7, 13], jnp.int32), jnp.array([0, 2, 5], jnp.int32)
    table = jnp.asarray(rng.permutation(8).reshape(2, 4), jnp.int32)
    clear_invocations()
    heads = NamedSharding(mesh1, P(None, "x"))
    out = ejk.ragged_paged_attention(jax.device_put(qp, heads), kp, vp, lens, table, cu, 2)
    close(out, reference_ragged_paged_attention(qp, kp, vp, lens, table, cu, 2))
    assert shapes("ragged_paged_attention") == {(5, 2, 16)}, shapes("ragged_paged_attention")
    qb = jax.device_put(q, NamedSharding(mesh1, P("x")))
    close(ejk.flash_attention(qb, k, v, causal=True), want)
    print("ok")
    """
)


def test_ops_run_per_shard_on_sharded_inputs() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", EJK_PLUGINS="xla", EJKERNEL_OPS_RECORD="1",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")
