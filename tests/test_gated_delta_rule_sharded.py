"""``ejk.gated_delta_rule`` on inputs sharded over batch rows and heads: one call per shard, the
same outputs, final states and gradients as unsharded. Runs in a fresh interpreter with four CPU devices."""

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
    from ejk.testing import GdrCase, gdr_inputs, reference_gated_delta_rule

    def shapes():
        calls = get_invocations(ejk.device_fingerprint())
        return {tuple(args[0].shape) for name, found in calls.items() if name.split("@")[0] == "gated_delta_rule"
                for _, args, _ in found.values()}

    def close(a, b, tol=2e-5):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(a / max(1.0, np.abs(b).max()), b / max(1.0, np.abs(b).max()), atol=tol, rtol=tol)

    q, k, v, g, beta, init = gdr_inputs(GdrCase(batch=4, length=20, heads=4, dk=8, dv=8, initial_state=True),
                                        jnp.float32)
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))
    call = lambda f: lambda q, k, v, g, beta, s: f(q, k, v, g, beta, initial_state=s, output_final_state=True)
    ours = call(lambda *a, **kw: ejk.gated_delta_rule(*a, **kw, platform="xla"))
    ref = lambda q, k, v, g, beta, s: reference_gated_delta_rule(q, k, v, g, beta, s)
    with jax.set_mesh(mesh):
        args = (put(q, "data", None, "model"), put(k, "data", None, "model"), put(v, "data", None, "model"),
                put(g, "data", None, "model"), put(beta, "data", None, "model"), put(init, "data", "model"))
        clear_invocations()
        o, final = jax.jit(ours)(*args)
        assert o.sharding.spec == P("data", None, "model", None), o.sharding
        assert final.sharding.spec == P("data", "model", None, None), final.sharding
        want_o, want_final = ref(q, k, v, g, beta, init)
        close(o, want_o)
        close(final, want_final)
        assert shapes() == {(2, 20, 2, 8)}, shapes()
        loss = lambda f: lambda *a: (f(*a)[0] * jnp.cos(a[2])).sum() + f(*a)[1].sum()
        got = jax.jit(jax.grad(loss(ours), argnums=tuple(range(6))))(*args)
        want = jax.grad(loss(ref), argnums=tuple(range(6)))(q, k, v, g, beta, init)
        for a, b in zip(got, want):
            close(a, b, 1e-4)
    print("ok")
    """
)


def test_gated_delta_rule_runs_per_shard() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", EJK_PLUGINS="xla", EJKERNEL_OPS_RECORD="1",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")
