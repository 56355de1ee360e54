"""``linear_cross_entropy`` (vocabulary-parallel and token-parallel) and ``rms_norm`` (row-parallel)
on sharded inputs: one call per shard, results and gradients as unsharded.

Runs in a fresh interpreter with four CPU devices. The recorded invocations show the
implementations saw per-shard shapes.
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
    from ejk.ops import ImplChoice
    from ejk.invocations import clear_invocations, get_invocations
    from ejk.testing import reference_linear_cross_entropy, reference_rms_norm

    def shapes(op, arg):
        calls = get_invocations(ejk.device_fingerprint())
        return {tuple(args[arg].shape) for name, found in calls.items() if name.split("@")[0] == op
                for _, args, _ in found.values()}

    def close(a, b, tol=2e-5):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=tol)

    rng = np.random.default_rng(0)
    t, h, v = 12, 8, 40
    x = jnp.asarray(rng.standard_normal((t, h)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((h, v)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, v, t), jnp.int32).at[::5].set(-100)
    options = dict(label_smoothing=0.1, z_loss=1e-3, logit_soft_cap=6.0)

    def loss(f):
        return lambda x, w: f(x, w, labels, **options)

    want = loss(reference_linear_cross_entropy)(x, w)
    want_grads = jax.grad(loss(reference_linear_cross_entropy), argnums=(0, 1))(x, w)

    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
    with jax.set_mesh(mesh):
        # Vocabulary-parallel w (Megatron's output layer) and data-parallel tokens, under jit.
        for xs, ws, seen, columns in (
            (x, put(w, None, "model"), (t, h), v // 2),
            (put(x, "data"), put(w, None, "model"), (t // 2, h), v // 2),
            (put(x, "data"), w, (t // 2, h), v),
        ):
            clear_invocations()
            got = jax.jit(loss(ejk.linear_cross_entropy))(xs, ws)
            close(got, want)
            assert shapes("linear_cross_entropy", 0) == {seen}, shapes("linear_cross_entropy", 0)
            assert shapes("linear_cross_entropy", 1) == {(h, columns)}, shapes("linear_cross_entropy", 1)
            # A vocabulary shard's statistics get a per-token cotangent: its call says reduction="none".
            told = {kwargs["reduction"] for found in get_invocations(ejk.device_fingerprint()).values()
                    for _, _, kwargs in found.values()}
            assert told == {"none" if columns < v else "mean"}, told
            grads = jax.jit(jax.grad(loss(ejk.linear_cross_entropy), argnums=(0, 1)))(xs, ws)
            for g, r in zip(grads, want_grads):
                close(g, r, 1e-4)
        # Per-token losses keep the tokens' sharding.
        none = jax.jit(lambda x, w: ejk.linear_cross_entropy(x, w, put(labels, "data"), reduction="none"))(
            put(x, "data"), put(w, None, "model"))
        close(none, reference_linear_cross_entropy(x, w, labels, reduction="none"))
        # ejk-xla's gradients-in-forward implementation: token shards use their saved gradients (each
        # shard's cotangent is a scalar times its own weights, z-loss and smoothing folded in); it refuses
        # vocabulary shards (a shard's share of the log-sum-exp's cotangent is per token), naming chunked.
        gif = ImplChoice(platform="xla", backend="any", implementation="grad_in_forward")
        for extra in ({}, {"label_smoothing": 0.1}, {"reduction": "sum", **options}):
            plain = lambda f, **k: lambda x, w: f(x, w, labels, **extra, **k)
            plain_grads = jax.grad(plain(reference_linear_cross_entropy), argnums=(0, 1))(x, w)
            grads = jax.jit(jax.grad(plain(ejk.linear_cross_entropy, cfg=gif), argnums=(0, 1)))(put(x, "data"), w)
            for g, r in zip(grads, plain_grads):
                close(g, r, 1e-4)
        try:
            jax.jit(loss(lambda *a, **k: ejk.linear_cross_entropy(*a, cfg=gif, **k)))(x, put(w, None, "model"))
        except ValueError as error:
            assert "xla/any:chunked" in str(error), error
        else:
            raise AssertionError("grad_in_forward ran a vocabulary shard")
        # A vocabulary split over both axes (4 shards of 10 columns).
        w4 = put(w, None, ("data", "model"))
        clear_invocations()
        close(jax.jit(loss(ejk.linear_cross_entropy))(x, w4), want)
        assert shapes("linear_cross_entropy", 1) == {(h, v // 4)}

        # rms_norm: rows over "data" and "model", scale replicated; forward and gradients.
        a = jnp.asarray(rng.standard_normal((4, 6, 16)), jnp.float32)
        s = jnp.asarray(1 + 0.1 * rng.standard_normal(16), jnp.float32)
        clear_invocations()
        out = jax.jit(lambda a, s: ejk.rms_norm(a, s))(put(a, "data", "model"), s)
        assert out.sharding.spec == P("data", "model", None), out.sharding
        close(out, reference_rms_norm(a, s))
        assert shapes("rms_norm", 0) == {(2, 3, 16)}, shapes("rms_norm", 0)
        f = lambda g: lambda a, s: (g(a, s) * jnp.cos(a)).sum()
        got = jax.jit(jax.grad(f(ejk.rms_norm), argnums=(0, 1)))(put(a, "data", "model"), s)
        for g, r in zip(got, jax.grad(f(reference_rms_norm), argnums=(0, 1))(a, s)):
            close(g, r, 1e-4)
        # With a residual: split like x, and so is the sum returned with the output.
        b = jnp.asarray(rng.standard_normal((4, 6, 16)), jnp.float32)
        y, h = jax.jit(lambda a, s, b: ejk.rms_norm(a, s, residual=b))(put(a, "data", "model"), s,
                                                                        put(b, "data", "model"))
        assert y.sharding.spec == h.sharding.spec == P("data", "model", None), (y.sharding, h.sharding)
        for got, want in zip((y, h), reference_rms_norm(a, s, b)):
            close(got, want)
        g2 = lambda norm: lambda a, s, b: sum((o * jnp.cos(a)).sum() for o in norm(a, s, b))
        got = jax.jit(jax.grad(g2(lambda a, s, b: ejk.rms_norm(a, s, residual=b)), argnums=(0, 1, 2)))(
            put(a, "data", "model"), s, put(b, "data", "model"))
        for g, r in zip(got, jax.grad(g2(reference_rms_norm), argnums=(0, 1, 2))(a, s, b)):
            close(g, r, 1e-4)
        # Inside the user's shard_map, x split and the residual replicated: the residual's gradient (the
        # same array as x's) is summed over the shards, as JAX's own broadcasting add would be.
        def body(norm):
            def local(a, s, b):
                y, h = norm(a, s, b)
                return jax.lax.psum((y * jnp.cos(h)).sum() + (h * h).sum(), ("data", "model"))
            return jax.shard_map(local, in_specs=(P(("data", "model")), P(), P()), out_specs=P())
        c = jnp.asarray(rng.standard_normal((6, 16)), jnp.float32)
        a4 = jnp.asarray(rng.standard_normal((24, 16)), jnp.float32)
        ours = lambda a, s, b: ejk.rms_norm(a, s, residual=b)
        got = jax.jit(jax.grad(body(ours), argnums=(0, 1, 2)))(put(a4, ("data", "model")), s, c)
        want = jax.jit(jax.grad(body(reference_rms_norm), argnums=(0, 1, 2)))(put(a4, ("data", "model")), s, c)
        for g, r in zip(got, want):
            close(g, r, 1e-4)
    print("ok")
    """
)


def test_losses_and_norms_run_per_shard_on_sharded_inputs() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", EJK_PLUGINS="xla", EJKERNEL_OPS_RECORD="1",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")
