"""``ejk.ring_attention`` against ``flash_attention`` on the gathered sequence, and ``flash_attention_lse``.

The ring needs several devices: each mesh size runs its cases in a fresh interpreter with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (set before JAX starts), as
``test_ops_shard_map.py`` does. Forward and gradients are compared in one jitted VJP per case.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.parallel import from_layout, layout_positions, ring_schedule, to_layout
from ejk.testing import jaxpr_equations, reference_flash_attention_lse

CODE = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import ejk
    from ejk.parallel import from_layout, to_layout
    from ejk.testing import reference_flash_attention

    n = int(sys.argv[1])
    cases = json.loads(sys.argv[2])
    results = []
    for case in cases:
        layout, dtype = case.pop("layout"), jnp.dtype(case.pop("dtype", "float32"))
        heads, kv_heads = case.pop("heads", (2, 1))
        q_rows, kv_rows = case.pop("rows", (4, 4))  # local lengths
        segments = case.pop("segments", False)
        use_sinks = case.pop("sinks", False)  # replicated [Hq], its gradient summed over the ring by shard_map
        sinks = jax.random.normal(jax.random.key(99), (heads,), jnp.float32) * 2
        # "mesh2d": batch over "dp" (2) and the ring over "sp" (n / 2) of a 2-D mesh.
        grid = (2, n // 2) if case.pop("mesh2d", False) else (1, n)
        mesh = Mesh(np.array(jax.devices()[:n]).reshape(grid), ("dp", "sp"))
        ring_n = grid[1]
        if "sliding_window" in case and isinstance(case["sliding_window"], list):
            case["sliding_window"] = tuple(case["sliding_window"])
        keys = jax.random.split(jax.random.key(len(results)), 6)
        q = jax.random.normal(keys[0], (2, ring_n * q_rows, heads, 8), dtype)
        k = jax.random.normal(keys[1], (2, ring_n * kv_rows, kv_heads, 8), dtype)
        v = jax.random.normal(keys[2], (2, ring_n * kv_rows, kv_heads, 8), dtype)
        ct = jax.random.normal(keys[3], (2, ring_n * q_rows, heads, 8), dtype)
        # Segments: runs of random length (position order), the same ids for q and k when lengths agree.
        qs = jnp.cumsum(jax.random.bernoulli(keys[4], 0.15, (2, ring_n * q_rows)).astype(jnp.int32), axis=1)
        ks = jnp.cumsum(jax.random.bernoulli(keys[5], 0.15, (2, ring_n * kv_rows)).astype(jnp.int32), axis=1)
        if q_rows == kv_rows:
            ks = qs
        segs = dict(q_segment_ids=qs, kv_segment_ids=ks) if segments else {}
        spec = P("dp", "sp")

        def local(q, k, v, qs, ks, s):
            local_segs = dict(q_segment_ids=qs, kv_segment_ids=ks) if segments else {}
            return ejk.ring_attention(q, k, v, axis_name="sp", layout=layout, sinks=s if use_sinks else None,
                                      **case, **local_segs)

        ring = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 5 + (P(),), out_specs=spec)
        to = lambda x: to_layout(x, layout, ring_n)

        def sharded(q, k, v, s):
            return from_layout(ring(to(q), to(k), to(v), to(qs), to(ks), s), layout, ring_n)

        def gathered(q, k, v, s):
            return reference_flash_attention(q, k, v, sinks=s if use_sinks else None, **case, **segs)

        def both(fn):
            return jax.jit(lambda q, k, v, s, ct: (lambda out, vjp: (out, *vjp(ct)))(*jax.vjp(fn, q, k, v, s)))

        got = both(sharded)(q, k, v, sinks, ct)
        f32 = lambda x: x.astype(jnp.float32)
        want = both(gathered)(f32(q), f32(k), f32(v), sinks, f32(ct))
        errors = [float(jnp.max(jnp.abs(f32(a) - b))) for a, b in zip(got, want)]
        scales = [float(jnp.max(jnp.abs(b))) for b in want]
        ppermutes = str(jax.make_jaxpr(sharded)(q, k, v, sinks)).count("ppermute")
        results.append({"errors": errors, "scales": scales, "ppermutes": ppermutes})
    print(json.dumps(results))
    """
)

# Per mesh size: layouts x masks x GQA x segment ids (each case compiles one ring, forward + backward).
CASES: dict[int, list[dict[str, object]]] = {
    2: [
        {"layout": "contiguous", "heads": [4, 2], "logits_soft_cap": 2.0},
        {"layout": "contiguous", "causal": True, "segments": True},
        {"layout": "zigzag", "causal": True, "sliding_window": [3, 0], "heads": [4, 1]},
        {"layout": "striped", "causal": True, "dtype": "bfloat16", "rows": [8, 8]},
        {"layout": "contiguous", "causal": True, "rows": [2, 4]},  # Sq != Sk: bottom-right aligned
        {"layout": "contiguous", "causal": True, "heads": [4, 2], "sinks": True, "rows": [6, 4]},  # rows see nothing
    ],
    4: [
        {"layout": "striped", "causal": True, "heads": [4, 2], "softmax_scale": 0.5},
        {"layout": "zigzag", "causal": True, "segments": True, "mesh2d": True},
        {"layout": "contiguous", "sliding_window": [5, 2], "logits_soft_cap": 1.5},
        {"layout": "zigzag", "causal": True, "sliding_window": [3, 0], "segments": True, "sinks": True},
    ],
    8: [
        {"layout": "zigzag", "causal": True, "heads": [4, 2]},
        {"layout": "striped", "causal": True, "sliding_window": 6, "segments": True},
        {"layout": "contiguous", "causal": True, "sliding_window": 3},  # needs ring steps 0 and 1 only
    ],
}


def _run(mesh_size: int) -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    # Backend optimisation level 0: a third less compile time, the same numerics for these checks.
    env.update(JAX_PLATFORMS="cpu", EJK_PLUGINS="xla",
               XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
    proc = subprocess.run([sys.executable, "-c", CODE, str(mesh_size), json.dumps(CASES[mesh_size])],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("mesh_size", sorted(CASES))
def test_ring_attention_matches_gathered_flash_attention(mesh_size: int) -> None:
    results = _run(mesh_size)
    assert len(results) == len(CASES[mesh_size])
    for case, result in zip(CASES[mesh_size], results, strict=True):
        atol = 5e-2 if case.get("dtype") == "bfloat16" else 2e-4
        for name, error, scale in zip(("out", "dq", "dk", "dv", "dsinks"), result["errors"], result["scales"],  # type: ignore[call-overload]
                                      strict=True):
            assert error <= atol * max(1.0, scale), f"{case}: {name} differs by {error} (scale {scale})"
    # Blocks the window hides are neither computed nor waited for: with a window of 3 and local
    # blocks of 4, only ring steps 0 and 1 run, so k and v travel once (2 ppermutes), not 7 times.
    if mesh_size == 8:
        assert results[-1]["ppermutes"] == 2
        assert results[0]["ppermutes"] == 2 * 7


def test_layout_helpers_round_trip() -> None:
    x = jnp.arange(2 * 16 * 3).reshape(2, 16, 3)
    for layout in ("contiguous", "zigzag", "striped"):
        positions = layout_positions(layout, 16, 4)
        assert sorted(positions.tolist()) == list(range(16))
        moved = to_layout(x, layout, 4)
        np.testing.assert_array_equal(moved[:, :, 0] // 3 % 16, np.broadcast_to(positions, (2, 16)))
        np.testing.assert_array_equal(from_layout(moved, layout, 4), x)
    assert layout_positions("zigzag", 8, 2).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert layout_positions("striped", 8, 2).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    with pytest.raises(ValueError, match="even local length"):
        layout_positions("zigzag", 6, 2)
    with pytest.raises(ValueError, match="layout is 'diagonal'"):
        layout_positions("diagonal", 8, 2)


def test_causal_layouts_balance_work() -> None:
    def per_device(layout: str) -> list[int]:
        return [sum(column) for column in zip(*ring_schedule(4, 8, 8, layout=layout, causal=True), strict=True)]

    contiguous, zigzag, striped = per_device("contiguous"), per_device("zigzag"), per_device("striped")
    assert sum(contiguous) == sum(zigzag) == sum(striped) == 32 * 33 // 2  # the causal triangle
    assert max(contiguous) > 6 * min(contiguous)
    assert max(zigzag) == min(zigzag)
    assert max(striped) - min(striped) <= 24
    # A window shorter than a block: two ring steps; device 0 has nothing at step 1 (it skips the block).
    window = ring_schedule(8, 4, 4, causal=True, sliding_window=(3, 0))
    assert len(window) == 2 and window[1][0] == 0 and min(window[1][1:]) > 0


def test_ring_gradient_lowers_without_zero_size_arrays() -> None:
    """The ring's backward accumulates by padded adds, not ``.at[].add`` scatters: no empty
    scatter-index constant enters the ``shard_map`` body (jax 0.11.2's Shardy pass segfaulted on it
    compiling the ring's gradient for two GPUs)."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    q = jnp.ones((1, 64, 4, 16))
    k = jnp.ones((1, 64, 2, 16))
    spec = P(None, "sp")
    ring = jax.shard_map(lambda q, k, v: ejk.ring_attention(q, k, v, axis_name="sp", causal=True),
                         mesh=Mesh(np.array(jax.devices()[:1]), ("sp",)), in_specs=(spec,) * 3, out_specs=spec)
    grad = jax.grad(lambda q, k, v: ring(q, k, v).sum(), argnums=(0, 1, 2))
    text = jax.jit(grad).lower(q, k, k).as_text()
    assert "tensor<0x" not in text


def test_ring_attention_errors() -> None:
    q = jnp.zeros((1, 4, 2, 8))
    with pytest.raises(ValueError, match="axis_name 'sp' is not a bound mesh axis"):
        ejk.ring_attention(q, q, q, axis_name="sp")
    with pytest.raises(ValueError, match="head_dim"):
        ejk.ring_attention(q, jnp.zeros((1, 4, 2, 4)), q, axis_name="sp")


@pytest.mark.parametrize("kwargs", [{}, {"causal": True, "logits_soft_cap": 2.0}, {"sliding_window": (2, 5)},
                                    {"segments": True}])
def test_flash_attention_lse_matches_reference(kwargs: dict[str, object]) -> None:
    keys = jax.random.split(jax.random.key(1), 5)
    q = jax.random.normal(keys[0], (2, 11, 4, 8))
    k = jax.random.normal(keys[1], (2, 7, 2, 8))
    v = jax.random.normal(keys[2], (2, 7, 2, 4))
    options = dict(kwargs)
    if options.pop("segments", False):
        options["q_segment_ids"] = jax.random.randint(keys[3], (2, 11), 0, 3)
        options["kv_segment_ids"] = jax.random.randint(keys[4], (2, 7), 0, 3)

    def loss(fn: object) -> object:
        def value(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            out, lse = fn(q, k, v, **options)  # type: ignore[operator]
            return jnp.sum(out * jnp.cos(out)) + jnp.sum(jnp.sin(jnp.where(jnp.isfinite(lse), lse, 0.0)))
        return value

    got_out, got_lse = ejk.flash_attention_lse(q, k, v, **options)  # type: ignore[arg-type]
    want_out, want_lse = reference_flash_attention_lse(q, k, v, **options)  # type: ignore[arg-type]
    np.testing.assert_allclose(got_out, want_out, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(got_lse, want_lse, atol=2e-5, rtol=2e-5)  # -inf where rows see nothing
    got = jax.grad(loss(ejk.flash_attention_lse), argnums=(0, 1, 2))(q, k, v)  # type: ignore[arg-type]
    want = jax.grad(loss(reference_flash_attention_lse), argnums=(0, 1, 2))(q, k, v)  # type: ignore[arg-type]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_attention_on_gpus(layout: str) -> None:
    """Every visible GPU (at least two) in one ring, bfloat16, causal with GQA, against one-device attention."""
    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip(f"needs two GPUs, found {len(devices)}")
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    mesh = Mesh(np.array(devices), ("sp",))
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (2, 1024 * n, 8, 128), jnp.bfloat16)
    k = jax.random.normal(keys[1], (2, 1024 * n, 2, 128), jnp.bfloat16)
    v = jax.random.normal(keys[2], (2, 1024 * n, 2, 128), jnp.bfloat16)
    ct = jax.random.normal(keys[3], q.shape, jnp.bfloat16)
    spec = P(None, "sp")
    ring = jax.shard_map(lambda q, k, v: ejk.ring_attention(q, k, v, axis_name="sp", causal=True, layout=layout),
                         mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)

    def sharded(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return from_layout(ring(*(to_layout(x, layout, n) for x in (q, k, v))), layout, n)

    def single(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return ejk.flash_attention(q, k, v, causal=True)

    def run(fn: object) -> list[jax.Array]:
        def both(q: jax.Array, k: jax.Array, v: jax.Array) -> list[jax.Array]:
            out, vjp = jax.vjp(fn, q, k, v)  # type: ignore[arg-type]
            return [out, *vjp(ct)]
        return jax.jit(both)(q, k, v)  # type: ignore[no-any-return]

    for got, want in zip(run(sharded), run(single), strict=True):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=5e-2, rtol=5e-2)


ABLATION_CODE = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import ejk
    from ejk.parallel import ring_ablation

    mesh = Mesh(np.array(jax.devices()[:2]).reshape(1, 2), ("dp", "sp"))
    q = jax.random.normal(jax.random.key(0), (1, 8, 2, 8))
    spec = P("dp", "sp")

    def ring():
        fn = jax.shard_map(lambda q: ejk.ring_attention(q, q, q, axis_name="sp"), mesh=mesh, in_specs=spec,
                           out_specs=spec)
        return jax.jit(fn)(q)

    full = ring()
    with ring_ablation(computation=False):
        no_compute = ring()
    with ring_ablation(communication=False):
        no_comm = ring()
    after = ring()
    print(json.dumps({"no_compute_zero": bool(jnp.all(no_compute == 0)),
                      "no_comm_differs": bool(jnp.max(jnp.abs(no_comm - full)) > 1e-3),
                      "restored": bool(jnp.array_equal(after, full))}))
    """
)


def test_ring_ablation_drops_computation_or_communication_only_inside_its_context() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", EJK_PLUGINS="xla",
               XLA_FLAGS="--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0")
    proc = subprocess.run([sys.executable, "-c", ABLATION_CODE], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "no_compute_zero": True, "no_comm_differs": True, "restored": True}


RESIDUAL_CODE = textwrap.dedent(
    """
    import json, math, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    from jax.sharding import Mesh, PartitionSpec as P
    import ejk
    from ejk.ops import FLASH_RESIDUALS, ImplChoice, without_residuals
    from ejk.parallel import from_layout, to_layout
    from ejk.testing import reference_flash_attention, reference_flash_attention_lse

    LN2 = math.log(2.0)

    def masks(q_segment_ids, kv_segment_ids, **static):
        return dict(causal=static["causal"], softmax_scale=static["softmax_scale"],
                    sliding_window=static["sliding_window"], logits_soft_cap=static["logits_soft_cap"],
                    q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)

    def fwd(q, k, v, *, q_segment_ids, kv_segment_ids, bias, cfg, precision="default", **static):
        out, lse = reference_flash_attention_lse(q, k, v, **masks(q_segment_ids, kv_segment_ids, **static))
        out = lax.reduce_precision(out, exponent_bits=8, mantissa_bits=23)  # a marker: one per forward run
        lse2 = jnp.where(lse == -jnp.inf, jnp.inf, lse / LN2)
        return out, (q, k, v, q_segment_ids, kv_segment_ids, bias, out, lse2)

    def bwd(residuals, d_out, *, d_lse=None, cfg, precision="default", **static):
        # Gradients of one block of the merged result from residuals holding the MERGED out and lse: the
        # block's own (o_b, lse_b) are recomputed here (by the reference, without the marker) and the merged
        # cotangents mapped onto them; a wrong row, lse base or cotangent from the ring shows in the values.
        q, k, v, qs, ks, bias, out, lse2 = residuals
        block = lambda q, k, v: reference_flash_attention_lse(q, k, v, **masks(qs, ks, **static))
        (o_b, lse_b), vjp = jax.vjp(block, q, k, v)
        total = jnp.where(lse2 == jnp.inf, -jnp.inf, lse2 * LN2)
        w = jnp.where(lse_b == -jnp.inf, 0.0, jnp.exp(lse_b - jnp.where(jnp.isfinite(total), total, 0.0)))
        delta = jnp.swapaxes(jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), -1), 1, 2)
        if d_lse is not None:
            delta = delta - d_lse
        g_out = (jnp.swapaxes(w, 1, 2)[..., None] * d_out.astype(jnp.float32)).astype(o_b.dtype)
        g_lse = jnp.swapaxes(jnp.sum(g_out.astype(jnp.float32) * o_b.astype(jnp.float32), -1), 1, 2) - w * delta
        return (*vjp((g_out, g_lse)), None, None, None)

    n, platform = int(sys.argv[1]), sys.argv[3]
    if platform == "xla":  # the test implementation above
        ejk.kernel_registry.register(
            "flash_attention", "xla", "cpu", name="merged_residuals",
            vjp=ejk.VJP(fwd=fwd, bwd=bwd, residuals=FLASH_RESIDUALS, extra_cotangents=("lse",)),
        )(without_residuals(fwd))
        options = dict(cfg=ImplChoice(platform="xla", backend="cpu", implementation="merged_residuals"))
    else:  # a real kernel (under its interpreter): the ring must not fall back to re-running block forwards
        import ejk.parallel._ring as ring_module

        def recomputed(*args, **kwargs):
            raise AssertionError("the ring re-ran a block's forward")

        ring_module._recomputed_grads = recomputed
        options = dict(platform=platform)

    results = []
    for case in json.loads(sys.argv[2]):
        layout = case.pop("layout")
        if isinstance(case.get("sliding_window"), list):
            case["sliding_window"] = tuple(case["sliding_window"])
        segments = case.pop("segments", False)
        mesh = Mesh(np.array(jax.devices()[:n]), ("sp",))
        keys = jax.random.split(jax.random.key(len(results)), 5)
        q = jax.random.normal(keys[0], (2, n * 4, 4, 8))
        k = jax.random.normal(keys[1], (2, n * 4, 2, 8))
        v = jax.random.normal(keys[2], (2, n * 4, 2, 8))
        ct = jax.random.normal(keys[3], q.shape)
        ids = jnp.cumsum(jax.random.bernoulli(keys[4], 0.2, (2, n * 4)).astype(jnp.int32), axis=1)
        segs = dict(q_segment_ids=ids, kv_segment_ids=ids) if segments else {}
        to = lambda x: to_layout(x, layout, n)

        def local(q, k, v, qs, ks):
            extra = dict(q_segment_ids=qs, kv_segment_ids=ks) if segments else {}
            return ejk.ring_attention(q, k, v, axis_name="sp", layout=layout, **options, **case, **extra)

        ring = jax.shard_map(local, mesh=mesh, in_specs=(P(None, "sp"),) * 5, out_specs=P(None, "sp"))
        sharded = lambda q, k, v: from_layout(ring(to(q), to(k), to(v), to(ids), to(ids)), layout, n)
        gathered = lambda q, k, v: reference_flash_attention(q, k, v, **case, **segs)
        grads = lambda fn: (lambda q, k, v, ct: (lambda out, vjp: (out, *vjp(ct)))(*jax.vjp(fn, q, k, v)))
        got = jax.jit(grads(sharded))(q, k, v, ct)
        want = grads(gathered)(q, k, v, ct)
        markers = lambda fn, *a: str(jax.make_jaxpr(fn)(*a)).count("reduce_precision")
        results.append({"errors": [float(jnp.max(jnp.abs(a - b))) for a, b in zip(got, want)],
                        "scales": [float(jnp.max(jnp.abs(b))) for b in want],
                        "forward_runs": markers(sharded, q, k, v),
                        "forward_runs_with_grads": markers(grads(sharded), q, k, v, ct)})
    print(json.dumps(results))
    """
)


@pytest.mark.parametrize(("mesh_size", "cases", "platform"), [
    (2, [{"layout": "contiguous", "logits_soft_cap": 2.0}, {"layout": "zigzag", "causal": True, "segments": True}],
     "xla"),
    (4, [{"layout": "striped", "causal": True, "sliding_window": [5, 0]}], "xla"),
    pytest.param(2, [{"layout": "zigzag", "causal": True, "segments": True}], "triton", id="ejk-triton"),
])
def test_ring_backward_runs_the_blocks_backward_on_the_merged_result(mesh_size: int, cases: list[dict[str, object]],
                                                                       platform: str) -> None:
    """An implementation whose backward takes the shared flash residuals gets the merged out / lse: the ring's
    gradients are exact and no block's forward runs again in the backward (a test implementation that marks its
    forward runs, and ejk-triton's kernels under the Triton interpreter)."""
    if platform == "triton" and importlib.util.find_spec("ejk_triton") is None:
        pytest.skip("ejk-triton is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", EJK_PLUGINS="xla" if platform == "xla" else f"xla,{platform}",
               EJK_TRITON_INTERPRET="1",
               XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
    proc = subprocess.run([sys.executable, "-c", RESIDUAL_CODE, str(mesh_size), json.dumps(cases), platform],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for case, result in zip(cases, results, strict=True):
        for name, error, scale in zip(("out", "dq", "dk", "dv"), result["errors"], result["scales"], strict=True):
            assert error <= 2e-4 * max(1.0, scale), f"{case}: {name} differs by {error} (scale {scale})"
        if platform == "xla":  # the test implementation's marker: one per forward run
            assert result["forward_runs"] > 0
            assert result["forward_runs_with_grads"] == result["forward_runs"], (case, result)


def test_the_backward_never_waits_for_the_accumulators_it_is_sent() -> None:
    """In the ring's backward the ``dk`` / ``dv`` accumulators that arrive by ``ppermute`` (float32) feed only the
    add after a step's compute, never the compute itself: XLA can run their transfer behind that compute. The
    key / value blocks (bf16 here) do feed it. Traced on an abstract 4-device mesh: no devices needed."""
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as P

    spec = P(None, "sp")
    ring = jax.shard_map(lambda q, k, v: ejk.ring_attention(q, k, v, axis_name="sp", causal=True, layout="zigzag"),
                         mesh=AbstractMesh((4,), ("sp",)), in_specs=(spec,) * 3, out_specs=spec)
    q = jax.ShapeDtypeStruct((1, 256, 4, 16), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, 256, 2, 16), jnp.bfloat16)
    grad = jax.make_jaxpr(jax.grad(lambda q, k, v: ring(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2)))

    bodies = [eqn.params["jaxpr"] for eqn in jaxpr_equations(grad(q, k, k)) if eqn.primitive.name == "shard_map"]
    body = bodies[-1]  # the backward's
    consumers: dict[Any, list[str]] = {}
    for eqn in body.eqns:
        for var in eqn.invars:
            if not hasattr(var, "val"):  # a variable, not a literal
                consumers.setdefault(var, []).append(eqn.primitive.name)
    sent = [(out.aval.dtype, consumers.get(out, [])) for eqn in body.eqns if eqn.primitive.name == "ppermute"
            for out in eqn.outvars]
    accumulators = [names for dtype, names in sent if dtype == jnp.float32]
    assert len(accumulators) == 6 and all(names == ["add"] for names in accumulators), sent  # 3 steps, dk and dv
    assert any("cond" in names for dtype, names in sent if dtype == jnp.bfloat16), sent
