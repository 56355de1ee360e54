"""``flash_attention_varlen`` on head-sharded inputs: one call per shard (sinks split with the q heads),
values and gradients as unsharded. Runs in a fresh interpreter with two CPU devices."""

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
    from ejk.testing import reference_flash_attention_varlen

    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((21, 4, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((19, 2, 8)), jnp.float32)
    sinks = jnp.asarray(rng.standard_normal(4), jnp.float32)
    cu_q, cu_k = jnp.asarray([0, 5, 5, 18], jnp.int32), jnp.asarray([0, 7, 9, 19], jnp.int32)
    loss = lambda f: lambda q, k, s: (f(q, k, k, cu_q, cu_k, causal=True, sinks=s) * jnp.cos(q)).sum()
    mesh = jax.make_mesh((2,), ("model",), axis_types=(AxisType.Explicit,))
    put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))
    with jax.set_mesh(mesh):
        qs, ks, ss = put(q, None, "model"), put(k, None, "model"), put(sinks, "model")
        clear_invocations()
        out = jax.jit(lambda q, k, s: ejk.flash_attention_varlen(q, k, k, cu_q, cu_k, causal=True, sinks=s))(qs, ks, ss)
        assert out.sharding.spec == P(None, "model", None), out.sharding
        want = reference_flash_attention_varlen(q, k, k, cu_q, cu_k, causal=True, sinks=sinks)
        np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-5, rtol=2e-5)
        calls = get_invocations(ejk.device_fingerprint())
        seen = {tuple(a[0].shape) for n, f in calls.items() if n.startswith("flash_attention_varlen@")
                for _, a, _ in f.values()}
        assert seen == {(21, 2, 8)}, seen
        got = jax.jit(jax.grad(loss(ejk.flash_attention_varlen), argnums=(0, 1, 2)))(qs, ks, ss)
        ref = jax.grad(loss(reference_flash_attention_varlen), argnums=(0, 1, 2))(q, k, sinks)
        for a, b in zip(got, ref):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)
    print("ok")
    """
)


def test_varlen_runs_per_head_shard() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", EJK_PLUGINS="xla", EJKERNEL_OPS_RECORD="1",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().endswith("ok")
