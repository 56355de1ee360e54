"""The public operations inside `shard_map` on 1-D and 2-D meshes (eight CPU devices, in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

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

    # Replicated sinks: their cotangent is summed over the batch axis the activations vary along.
    sinks = jnp.array([0.5, -1.0, 2.0, 0.0])
    with_sinks = jax.jit(shard_map(lambda q, k, v, s: ejk.flash_attention(q, k, v, causal=True, sinks=s), mesh=mesh,
                                   in_specs=(spec, spec, spec, P()), out_specs=spec))
    got = jax.jit(jax.grad(lambda s: (with_sinks(q, k, v, s) ** 2).sum()))(sinks)
    want = jax.grad(lambda s: (reference_flash_attention(q, k, v, causal=True, sinks=s) ** 2).sum())(sinks)
    assert_close(got, want, jnp.float32, what="dsinks")

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
    # Gradients: lhs is replicated, so its cotangent is summed over the axis (the implementation's custom VJP).
    gmm_loss = lambda f: lambda lhs, rhs: (f(lhs, rhs, sizes) * jnp.cos(jnp.arange(8.0))).sum()
    got = jax.jit(jax.grad(gmm_loss(gmm), argnums=(0, 1)))(lhs, rhs)
    want = jax.grad(gmm_loss(reference_grouped_matmul), argnums=(0, 1))(lhs, rhs)
    for name, g, w in zip(("dlhs", "drhs"), got, want):
        assert_close(g, w, jnp.float32, what=name, kind="matmul")

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

    # 2-D mesh (2 x 4): every op with one dim over "data" and another over "model".
    mesh2 = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    smap = lambda f, i, o: jax.jit(shard_map(f, mesh=mesh2, in_specs=i, out_specs=o))
    qkv = P("data", None, "model", None)
    q8 = jax.random.normal(keys[0], (2, 32, 8, 16))
    k4, v4 = (jax.random.normal(key, (2, 32, 4, 16)) for key in keys[1:])
    fa = smap(lambda q, k, v: ejk.flash_attention(q, k, v, causal=True), (qkv,) * 3, qkv)
    assert_close(fa(q8, k4, v4), reference_flash_attention(q8, k4, v4, causal=True), jnp.float32)
    grad = jax.jit(jax.grad(lambda q, k: (fa(q, k, v4) * q).sum(), argnums=(0, 1)))(q8, k4)
    want = jax.grad(lambda q, k: (reference_flash_attention(q, k, v4, causal=True) * q).sum(), argnums=(0, 1))(q8, k4)
    assert_close(grad[0], want[0], jnp.float32, what="dq")
    assert_close(grad[1], want[1], jnp.float32, what="dk")
    fal = smap(lambda q, k, v: ejk.flash_attention_lse(q, k, v), (qkv,) * 3, (qkv, P("data", "model", None)))
    o, lse = fal(q8, k4, v4)
    want_o, want_lse = ejk.testing.reference_flash_attention_lse(q8, k4, v4)
    assert_close(o, want_o, jnp.float32)
    assert_close(lse, want_lse, jnp.float32, what="lse")
    # matmul: rows over "data", columns over "model"; the contraction over "model" with a psum.
    a2 = jax.random.normal(keys[2], (8, 16))
    b2 = jax.random.normal(keys[1], (16, 8))
    mm = smap(ejk.matmul, (P("data"), P(None, "model")), P("data", "model"))
    assert_close(mm(a2, b2), a2 @ b2, jnp.float32, kind="matmul")
    mk = smap(lambda a, b: jax.lax.psum(ejk.matmul(a, b), "model"), (P("data", "model"), P("model")), P("data"))
    assert_close(mk(a2, b2), a2 @ b2, jnp.float32, kind="matmul")
    # grouped matmul: columns over "model", the replicated "data" axis carried along.
    gmm2 = smap(lambda lhs, rhs, sizes: ejk.grouped_matmul(lhs, rhs, sizes),
                (P(), P(None, None, "model"), P()), P(None, "model"))
    assert_close(gmm2(lhs, rhs, sizes), reference_grouped_matmul(lhs, rhs, sizes), jnp.float32, kind="matmul")
    # paged attention: heads over "model" (one kv head each), "data" replicated.
    qp8 = jnp.asarray(rng.standard_normal((5, 8, 16)), jnp.float32)
    kp4, vp4 = (jnp.asarray(rng.standard_normal((8, 4, 4, 16)), jnp.float32) for _ in range(2))
    heads2, pages2 = P(None, "model", None), P(None, None, "model", None)
    rpa2 = smap(lambda q, kp, vp, lens, table, cu: ejk.ragged_paged_attention(q, kp, vp, lens, table, cu, 2),
                (heads2, pages2, pages2, P(), P(), P()), heads2)
    want = reference_ragged_paged_attention(qp8, kp4, vp4, kv_lens, table, cu, 2)
    assert_close(rpa2(qp8, kp4, vp4, kv_lens, table, cu), want, jnp.float32, kind="paged")
    print("ok", len(jax.devices()))
    """
)


def test_ops_compose_with_shard_map() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok 8")


@pytest.mark.gpu
def test_flash_attention_gradients_under_shard_map_on_gpus() -> None:
    """bf16 attention (cuDNN where it is installed) per batch shard on every visible GPU, gradients
    taken outside ``shard_map``, against the unsharded op. jax 0.11.2's Shardy pass segfaulted
    compiling this while the Executor kept each kernel as a nested ``jit`` call (see executor.py)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import ejk

    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip(f"needs two GPUs, found {len(devices)}")
    n = len(devices)
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (2 * n, 1024, 8, 128), jnp.bfloat16)
    k = jax.random.normal(keys[1], (2 * n, 1024, 4, 128), jnp.bfloat16)
    v = jax.random.normal(keys[2], (2 * n, 1024, 4, 128), jnp.bfloat16)
    ct = jax.random.normal(keys[3], q.shape, jnp.bfloat16)
    spec = P("batch")
    local = jax.shard_map(lambda q, k, v: ejk.flash_attention(q, k, v, causal=True),
                          mesh=Mesh(np.array(devices), ("batch",)), in_specs=(spec,) * 3, out_specs=spec)

    def run(fn: object) -> list[jax.Array]:
        def both(q: jax.Array, k: jax.Array, v: jax.Array) -> list[jax.Array]:
            out, vjp = jax.vjp(fn, q, k, v)  # type: ignore[arg-type]
            return [out, *vjp(ct)]
        return jax.jit(both)(q, k, v)  # type: ignore[no-any-return]

    single = run(lambda q, k, v: ejk.flash_attention(q, k, v, causal=True))
    for got, want in zip(run(local), single, strict=True):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=2e-2, rtol=2e-2)


UNTYPED_OUTPUT_CODE = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import ejk

    # A kernel whose output does not carry the mesh axes its inputs vary along, as a Mosaic GPU custom call's
    # does not (here: a constant).
    def fwd(a, b, *, precision, preferred_element_type, cfg=None):
        out = jnp.zeros((a.shape[0], b.shape[1]), preferred_element_type)
        return out, (a, b)

    def bwd(residuals, d_out, *, precision, preferred_element_type, cfg=None):
        a, b = residuals
        return jnp.zeros_like(a), jnp.zeros_like(b)

    ejk.kernel_registry.register("matmul", "untyped", "any", name="zeros",
                                 vjp=ejk.VJP(fwd=fwd, bwd=bwd, residuals="untyped:test"))(
        lambda a, b, *, precision, preferred_element_type, cfg=None: fwd(
            a, b, precision=precision, preferred_element_type=preferred_element_type)[0])
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    a = jnp.ones((4, 8), jnp.float32)
    b = jnp.ones((8, 4), jnp.float32)

    def loss(a, b):  # the product's cotangent varies along "data", as a ring attention block's does
        return jnp.sum(ejk.matmul(a, b, platform="untyped") * a[:, :4])

    from ejk.parallel import varying_axes

    axes = []

    def forward(a, b):
        out = ejk.matmul(a, b, platform="untyped")
        axes.append(sorted(varying_axes(out)))
        return out

    jax.jit(jax.shard_map(forward, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data")))(a, b)
    assert axes == [["data"]], axes
    grad = jax.jit(jax.shard_map(jax.grad(loss), mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data")))
    print("ok", grad(a, b).shape)
    """
)


def test_an_output_without_the_inputs_mesh_axes_is_typed_like_them() -> None:
    # The core casts every implementation's output to vary along its inputs' mesh axes, so a kernel that does
    # not (a custom call) still differentiates under shard_map: the cotangent varies along them.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    result = subprocess.run([sys.executable, "-c", UNTYPED_OUTPUT_CODE], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok (4, 8)")
