"""``ejk.gla`` and ``ejk.ssd`` on sharded inputs: batch rows over one mesh axis, heads (with ``ssd``'s
groups) over the other, one call per shard, forward and gradients as unsharded.

Runs in a fresh interpreter with four CPU devices.
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
    from ejk.testing import reference_gla, reference_ssd

    def shapes(op):
        calls = get_invocations(ejk.device_fingerprint())
        return {tuple(args[0].shape) for name, found in calls.items() if name.split("@")[0] == op
                for _, args, _ in found.values()}

    def close(a, b, tol=1e-4):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=tol)

    rng = np.random.default_rng(0)
    normal = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))
    with jax.set_mesh(mesh):
        q, k, v = normal(4, 12, 4, 8), normal(4, 12, 4, 8), normal(4, 12, 4, 6)
        g = jax.nn.log_sigmoid(normal(4, 12, 4, 8) + 2.0)
        s0 = normal(4, 4, 8, 6)
        sharded = [put(x, "data", None, "model") for x in (q, k, v, g)] + [put(s0, "data", "model")]
        clear_invocations()
        o, s = jax.jit(lambda *a: ejk.gla(*a[:4], initial_state=a[4], output_final_state=True))(*sharded)
        want_o, want_s = reference_gla(q, k, v, g, s0)
        close(o, want_o)
        close(s, want_s)
        assert shapes("gla") == {(2, 12, 2, 8)}, shapes("gla")
        loss = lambda f: lambda *a: (f(*a[:4], initial_state=a[4])[0] * jnp.cos(a[2])).sum()
        ours = lambda *a, initial_state: ejk.gla(*a, initial_state=initial_state)
        got = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2, 3, 4)))(*sharded)
        ref = jax.grad(loss(lambda *a, initial_state: reference_gla(*a, initial_state)), argnums=(0, 1, 2, 3, 4))(
            q, k, v, g, s0)
        for a, b in zip(got, ref):
            close(a, b)

        x, dt, bb, cc = normal(4, 10, 4, 6), normal(4, 10, 4) - 1.0, normal(4, 10, 2, 5), normal(4, 10, 2, 5)
        a_log, d = -jnp.exp(normal(4)), normal(4)
        args = (put(x, "data", None, "model"), put(dt, "data", None, "model"), put(a_log, "model"),
                put(bb, "data", None, "model"), put(cc, "data", None, "model"), put(d, "model"))
        clear_invocations()
        y, s = jax.jit(lambda *a: ejk.ssd(*a[:5], D=a[5], dt_softplus=True, output_final_state=True))(*args)
        want_y, want_s = reference_ssd(x, dt, a_log, bb, cc, d, dt_softplus=True)
        close(y, want_y)
        close(s, want_s)
        assert shapes("ssd") == {(2, 10, 2, 6)}, shapes("ssd")
        loss = lambda f: lambda *a: (f(*a)[0] * jnp.cos(a[0])).sum()
        got = jax.jit(jax.grad(loss(lambda *a: ejk.ssd(*a[:5], D=a[5], dt_softplus=True)), argnums=tuple(range(6))))(
            *args)
        ref = jax.grad(loss(lambda *a: reference_ssd(*a, dt_softplus=True)), argnums=tuple(range(6)))(
            x, dt, a_log, bb, cc, d)
        for a, b in zip(got, ref):
            close(a, b)
    print("OK")
    """
)


def test_linear_recurrences_run_per_shard_on_sharded_inputs() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", EJK_PLUGINS="xla", EJKERNEL_OPS_RECORD="1",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().endswith("OK")
