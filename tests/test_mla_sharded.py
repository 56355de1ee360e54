"""``ejk.mla_paged_attention`` on sharded inputs: one call per shard (sequences and query heads), the pages whole.

Runs in a fresh interpreter with four CPU devices, ejk-xla only.
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
    from ejk.testing import mla_batch, mla_paged_attention_float64

    def shapes():
        calls = get_invocations(ejk.device_fingerprint())
        return {tuple(args[0].shape) for name, found in calls.items() if name.split("@")[0] == "mla_paged_attention"
                for _, args, _ in found.values()}

    q, kv, lens, table = mla_batch(0, kv_lens=(9, 0, 14, 3), sq=2, hq=4, dk=24, page=4)
    want = mla_paged_attention_float64(q, kv, lens, table, v_head_dim=16)
    call = lambda *a: ejk.mla_paged_attention(*a, v_head_dim=16)

    # 2-D mesh, explicit axes, under jit: sequences over "data", query heads over "model".
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))
    with jax.set_mesh(mesh):
        clear_invocations()
        out = jax.jit(call)(put(q, "data", None, "model"), kv, put(lens, "data"), put(table, "data"))
        assert out.sharding.spec == P("data", None, "model", None), out.sharding
        np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=2e-5)
        assert shapes() == {(2, 2, 2, 24)}, shapes()

    # 1-D mesh of four, auto axes, eager on committed arrays: query heads over "x".
    mesh1 = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Auto,))
    clear_invocations()
    out = call(jax.device_put(q, NamedSharding(mesh1, P(None, None, "x"))), kv, lens, table)
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=2e-5)
    assert shapes() == {(4, 2, 1, 24)}, shapes()
    print("ok")
    """
)


def test_mla_runs_per_shard_on_sharded_inputs() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", EJK_PLUGINS="xla", EJKERNEL_OPS_RECORD="1",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")
