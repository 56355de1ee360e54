"""``ejk.parallel.to_layout`` / ``from_layout`` on arrays sharded along the sequence (issue 30): with an
``Explicit`` mesh (jax 0.10's and 0.11's explicit sharding) or a concrete ``NamedSharding``, the rows move
between devices with ``ppermute`` and keep their sharding; the sharding docs' ring-attention example runs
on such a mesh under ``jax.jit``, with gradients. Several CPU devices: one fresh interpreter
with ``--xla_force_host_platform_device_count=4``, as ``test_ring_attention.py`` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

CODE = textwrap.dedent(
    """
    import json
    from functools import partial
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import ejk
    from ejk.parallel import from_layout, layout_positions, to_layout
    from ejk.testing import reference_flash_attention

    report = {}
    x = jnp.arange(2 * 16 * 3, dtype=jnp.float32).reshape(2, 16, 3)
    CASES = [((4,), ("sp",), P(None, "sp"), AxisType.Explicit, layout)
             for layout in ("contiguous", "zigzag", "striped")]
    CASES += [((2, 2), ("dp", "sp"), P("dp", "sp"), AxisType.Explicit, "zigzag"),
              ((4,), ("sp",), P(None, "sp"), AxisType.Auto, "zigzag")]
    for grid, names, spec, kind, layout in CASES:
        mesh = jax.make_mesh(grid, names, axis_types=(kind,) * len(grid))
        ring = grid[-1]
        xs = jax.device_put(x, NamedSharding(mesh, spec))
        order = layout_positions(layout, 16, ring)
        want = np.take(np.asarray(x), order, axis=1)
        with jax.set_mesh(mesh):
            eager = to_layout(xs, layout, ring)
            both = jax.jit(lambda x: (lambda y: (y, from_layout(y, layout, ring)))(to_layout(x, layout, ring)))
            jitted, back = both(xs)
            grad = jax.jit(jax.grad(lambda x: (to_layout(x, layout, ring) * want).sum()))(xs)
            ppermutes = str(jax.make_jaxpr(lambda x: to_layout(x, layout, ring))(xs)).count("ppermute")
        report[f"{kind.name} {'x'.join(map(str, grid))} {layout}"] = {
            "values": bool(np.array_equal(eager, want) and np.array_equal(jitted, want) and np.array_equal(back, x)),
            "grad": bool(np.array_equal(grad, np.take(want, np.argsort(order), axis=1))),
            "spec": [str(eager.sharding.spec), str(jitted.sharding.spec)],
            "ppermutes": ppermutes,
        }

    # The docs' ring example on an Explicit mesh: no host round trip, gradients too.
    n = 4
    mesh = jax.make_mesh((n,), ("sp",), axis_types=(AxisType.Explicit,))
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, ct = (jax.random.normal(key, (1, 8 * n, 2, 8), jnp.float32) for key in keys)
    spec = P(None, "sp")
    q, k, v, ct = (jax.device_put(t, NamedSharding(mesh, spec)) for t in (q, k, v, ct))
    with jax.set_mesh(mesh):
        ring = jax.shard_map(partial(ejk.ring_attention, axis_name="sp", causal=True, layout="zigzag"),
                             mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)

        def attend(q, k, v):
            return from_layout(ring(*(to_layout(x, "zigzag", n) for x in (q, k, v))), "zigzag", n)

        out, *grads = jax.jit(lambda q, k, v, ct: (lambda o, f: (o, *f(ct)))(*jax.vjp(attend, q, k, v)))(q, k, v, ct)
    gathered = [np.asarray(t) for t in (q, k, v, ct)]
    want_out, want_vjp = jax.vjp(partial(reference_flash_attention, causal=True), *gathered[:3])
    want_grads = want_vjp(gathered[3])
    report["ring"] = {
        "error": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                     for a, b in zip((out, *grads), (want_out, *want_grads))),
        "spec": str(out.sharding.spec),
    }
    print(json.dumps(report))
    """
)


def test_layouts_of_sharded_arrays_and_the_ring_example() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", EJK_PLUGINS="xla",
               XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0")
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    ring = report.pop("ring")
    assert ring["error"] < 1e-4 and "'sp'" in ring["spec"]
    assert len(report) == 5
    for key, found in report.items():
        assert found["values"] and found["grad"], key
        if key.startswith("Explicit"):
            assert all("'sp'" in spec for spec in found["spec"]), key  # the result stays sharded
    # Rows move directly: zigzag needs two rounds over 4 devices, striped three (everyone to everyone),
    # a contiguous layout none.
    assert [report[f"Explicit 4 {layout}"]["ppermutes"] for layout in ("contiguous", "zigzag", "striped")] == [0, 2, 3]
