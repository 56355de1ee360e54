"""Sharded inputs without ``shard_map``, eight CPU devices: grouped matmul by experts, rows and
contraction (with and without its SwiGLU activation); matmul with a sharded contraction; paged
attention split by tokens.

One fresh interpreter (``--xla_force_host_platform_device_count=8``), 1-D and 2-D meshes with
``Explicit`` axes under ``jax.jit``. Forward and gradients are compared with the unsharded
references; the recorded invocations show each device's kernel ran on per-shard shapes.
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
    from ejk.testing import reference_grouped_matmul, reference_ragged_paged_attention

    def shapes(op):
        calls = get_invocations(ejk.device_fingerprint())
        return {tuple(tuple(a.shape) for a in args[:2]) for name, found in calls.items()
                if name.split("@")[0] == op for _, args, _ in found.values()}

    def close(a, b, tol=1e-4):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=tol, rtol=tol)

    keys = jax.random.split(jax.random.key(0), 4)
    lhs = jax.random.normal(keys[0], (32, 16))
    rhs = jax.random.normal(keys[1], (8, 16, 8))
    weight = jnp.cos(jnp.arange(8.0))
    # Uneven sizes, empty groups (first, middle, last), rows past the sum (zeros).
    SIZES = [jnp.array(s, jnp.int32) for s in ([0, 5, 0, 7, 3, 0, 9, 0], [1, 2, 3, 4, 5, 6, 7, 4],
                                                [0, 0, 0, 30, 0, 0, 0, 0])]

    def loss(f, sizes, activation=None):
        return lambda l, r: (f(l, r, sizes, activation=activation) * weight[: 4 if activation else 8]).sum()

    def check(mesh, lhs_spec, rhs_spec, out_spec, local, grads=False, sizes_all=SIZES, activation=None):
        put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))
        with jax.set_mesh(mesh):
            l, r = put(lhs, lhs_spec), put(rhs, rhs_spec)
            f = jax.jit(lambda l, r, sizes: ejk.grouped_matmul(l, r, sizes, activation=activation))
            clear_invocations()
            for sizes in sizes_all:
                out = f(l, r, sizes)
                assert out.sharding.spec == out_spec, (lhs_spec, rhs_spec, out.sharding.spec)
                close(out, reference_grouped_matmul(lhs, rhs, sizes, activation=activation))
            assert shapes("grouped_matmul") == {local}, shapes("grouped_matmul")
            if grads:
                g = jax.jit(jax.grad(loss(ejk.grouped_matmul, sizes_all[0], activation), argnums=(0, 1)))(l, r)
                want = jax.grad(loss(reference_grouped_matmul, sizes_all[0], activation), argnums=(0, 1))(lhs, rhs)
                for a, b in zip(g, want):
                    close(a, b)

    # 1-D mesh of eight: one expert per device (psum); rows sharded like the experts (reduce-scatter).
    m1 = jax.make_mesh((8,), ("e",), axis_types=(AxisType.Explicit,))
    check(m1, P(), P("e"), P(None, None), ((32, 16), (1, 16, 8)), grads=True)
    check(m1, P("e"), P("e"), P("e", None), ((32, 16), (1, 16, 8)), grads=True)
    # Rows only (rhs replicated): every group boundary works, the local sizes are clipped.
    check(m1, P("e"), P(), P("e", None), ((4, 16), (8, 16, 8)), grads=True)

    # 2-D mesh: experts over "y" with rows over "x", experts over both, experts and columns,
    # experts and the contraction.
    m2 = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    check(m2, P("x"), P("y"), P("x", None), ((16, 16), (2, 16, 8)), grads=True)
    check(m2, P(), P(("x", "y")), P(None, None), ((32, 16), (1, 16, 8)), sizes_all=SIZES[:1])
    check(m2, P(), P("x", None, "y"), P(None, "y"), ((32, 16), (4, 16, 2)), grads=True, sizes_all=SIZES[:1])
    check(m2, P(None, "y"), P("x", "y"), P(None, None), ((32, 4), (4, 4, 8)), grads=True, sizes_all=SIZES[:1])

    # activation="swiglu": experts and rows split as before; rhs's columns are gathered (a block would hold
    # gate columns without their up columns); a split contraction sums the plain products, then gates.
    check(m1, P("e"), P("e"), P("e", None), ((32, 16), (1, 16, 8)), grads=True, activation="swiglu")
    check(m2, P(), P("x", None, "y"), P(None, None), ((32, 16), (4, 16, 8)), grads=True, sizes_all=SIZES[:1],
          activation="swiglu")
    check(m2, P(None, "y"), P("x", "y"), P(None, None), ((32, 4), (4, 4, 8)), grads=True, sizes_all=SIZES[:1],
          activation="swiglu")

    with jax.set_mesh(m2):
        put = lambda x, *spec: jax.device_put(x, NamedSharding(m2, P(*spec)))
        # Float32 partials of a split contraction, rounded once: bfloat16 output as unsharded.
        lb, rb = lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16)
        out = jax.jit(ejk.grouped_matmul)(put(lb, None, "y"), put(rb, None, "y"), SIZES[1])
        assert out.dtype == jnp.bfloat16
        close(out, ejk.grouped_matmul(lb, rb, SIZES[1]), 1e-2)
        # JAX itself refuses experts that do not divide the devices (no uneven layouts).
        try:
            put(rhs[:3], "x")
        except ValueError as exc:
            assert "divide" in str(exc), exc
        else:
            raise AssertionError("an uneven expert sharding was accepted")

        # matmul: the contraction split (psum), with rows and alone on b.
        a = jax.random.normal(keys[2], (4, 8, 16))
        b = jax.random.normal(keys[3], (16, 8))
        mm = lambda a, b: (ejk.matmul(a, b) * weight).sum()
        want = jax.grad(lambda a, b: (jnp.matmul(a, b, precision="highest") * weight).sum(), argnums=(0, 1))(a, b)
        for sa, sb, local in (((None, "x", "y"), ("y",), (4, 4, 4)), ((), ("x",), (4, 8, 8))):
            clear_invocations()
            out = jax.jit(ejk.matmul)(put(a, *sa), put(b, *sb))
            close(out, jnp.matmul(a, b, precision="highest"))
            assert {s[0] for s in shapes("matmul")} == {local}, shapes("matmul")
            for got, ref in zip(jax.jit(jax.grad(mm, argnums=(0, 1)))(put(a, *sa), put(b, *sb)), want):
                close(got, ref)

        # Batched matmul: batch over "x" in both operands, columns over "y"; b broadcast along the batch.
        bb = jax.random.normal(keys[3], (4, 16, 8))
        out = jax.jit(ejk.matmul)(put(a, "x"), put(bb, "x", None, "y"))
        assert out.sharding.spec == P("x", None, "y"), out.sharding
        close(out, jnp.matmul(a, bb, precision="highest"))
        close(jax.jit(ejk.matmul)(put(a, "x"), bb[:1]), jnp.matmul(a, bb[:1], precision="highest"))

        # Paged attention by tokens (and heads): sequences straddle the blocks; windows keep positions.
        rng = np.random.default_rng(0)
        qp = jnp.asarray(rng.standard_normal((16, 4, 16)), jnp.float32)
        kp, vp = (jnp.asarray(rng.standard_normal((12, 4, 2, 16)), jnp.float32) for _ in range(2))
        lens, cu = jnp.array([9, 12, 3, 4], jnp.int32), jnp.array([0, 5, 10, 13, 14], jnp.int32)
        table = jnp.asarray(rng.permutation(12).reshape(4, 3), jnp.int32)
        for live, window, spec, local in ((4, None, ("y", "x"), (4, 2, 16)), (3, 3, (("x", "y"),), (2, 4, 16))):
            clear_invocations()
            f = jax.jit(lambda q: ejk.ragged_paged_attention(q, kp, vp, lens, table, cu, live, sliding_window=window))
            out = f(put(qp, *spec))
            close(out, reference_ragged_paged_attention(qp, kp, vp, lens, table, cu, live, sliding_window=window))
            assert {s[0] for s in shapes("ragged_paged_attention")} == {local}
    print("ok")
    """
)


def test_sharded_experts_rows_and_contractions() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", EJK_PLUGINS="xla", EJKERNEL_OPS_RECORD="1",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")
