"""``linear_cross_entropy``'s loss options (``reduction``, ``label_smoothing``, ``z_loss``) reach the
implementations as advisory extension arguments: one that names them receives them, one written
before them is called without them and still runs every call (its statistics do not depend on them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.plugins
from ejk._contract import Extension
from ejk.ops import LINEAR_CROSS_ENTROPY_RESIDUALS, LinearCrossEntropyKernel, get_op
from ejk.ops._linear_cross_entropy._op import loss_from_statistics
from ejk.ops._linear_cross_entropy._reference import reference_statistics
from ejk.plugins import PlatformStatus, PluginHost
from ejk.testing import reference_linear_cross_entropy

SEEN: list[tuple[str, dict[str, Any]]] = []


def _statistics(x: jax.Array, w: jax.Array, labels: jax.Array, cap: Any) -> tuple[jax.Array, ...]:
    return reference_statistics(x, w, labels, logit_soft_cap=cap)


def old_fwd(x: jax.Array, w: jax.Array, labels: jax.Array, *, logit_soft_cap: Any, precision: Any,
            cfg: Any) -> Any:
    """An implementation written before the loss options reached implementations."""
    SEEN.append(("old", {}))
    stats = _statistics(x, w, labels, logit_soft_cap)
    return stats, (x, w, labels, stats[0])


def old_bwd(residuals: Any, cotangents: Any, *, logit_soft_cap: Any, precision: Any, cfg: Any) -> Any:
    x, w, labels, _ = residuals
    _, pullback = jax.vjp(lambda x, w: _statistics(x, w, labels, logit_soft_cap), x, w)
    return (*pullback(tuple(jnp.zeros_like(residuals[3]) if c is None else c for c in cotangents)), None)


def new_fwd(x: jax.Array, w: jax.Array, labels: jax.Array, *, logit_soft_cap: Any, precision: Any, cfg: Any,
            reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0) -> Any:
    """One that names them (and records what it was told)."""
    SEEN.append(("new", {"reduction": reduction, "label_smoothing": label_smoothing, "z_loss": z_loss}))
    stats = _statistics(x, w, labels, logit_soft_cap)
    return stats, (x, w, labels, stats[0])


def _first(fwd: Any) -> Any:
    def forward(*args: Any, **kwargs: Any) -> Any:
        return fwd(*args, **kwargs)[0]

    forward.__wrapped__ = fwd  # type: ignore[attr-defined]  # its signature is the forward's
    return forward


def _plugin(name: str, fwd: Any, priority: int) -> object:
    class Plugin:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("linear_cross_entropy", "xla", "any", priority, name=name,
                     vjp=ejk.VJP(fwd=fwd, bwd=old_bwd, residuals=LINEAR_CROSS_ENTROPY_RESIDUALS))(_first(fwd))

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="xla", available=True)

    return Plugin()


@pytest.fixture
def host() -> PluginHost:
    SEEN.clear()
    return ejk.plugins.get_plugin_host()  # the private, empty host of conftest


def _run(host: PluginHost, tmp_path: Path, *args: Any, **options: Any) -> Any:
    kernel = LinearCrossEntropyKernel(host.registry)
    executor: ejk.Executor[Any, Any] = ejk.Executor(ejk.ConfigSelectorChain(persistent_dir=tmp_path))
    arrays, static = kernel.normalize(*args, **options)
    lse, z_label, z_sum = executor(kernel, *arrays, platform="auto", **static)
    return loss_from_statistics(lse, z_label, z_sum, arrays[2], vocab=arrays[1].shape[1],
                                ignore_index=options.get("ignore_index", -100),
                                reduction=static["reduction"], label_smoothing=static["label_smoothing"],
                                z_loss=static["z_loss"])


def _inputs() -> tuple[jax.Array, jax.Array, jax.Array]:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 9, 6)
    labels[2] = -100
    x, w = rng.standard_normal((6, 4)), rng.standard_normal((4, 9))
    return jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32), jnp.asarray(labels, jnp.int32)


OPTIONS = {"reduction": "sum", "label_smoothing": 0.1, "z_loss": 1e-2, "logit_soft_cap": 5.0}


def test_the_contract_lists_the_loss_options_as_optional() -> None:
    contract = get_op("linear_cross_entropy").call_contract()
    assert contract is not None
    described = contract.describe()
    assert all(f"[{name}]" in described for name in ("reduction", "label_smoothing", "z_loss")), described
    assert contract.problems(old_fwd) == [] and contract.problems(new_fwd) == []
    advisory = Extension("z_loss", legacy=0.0, advisory=True)
    assert advisory.is_legacy(1e-3) and advisory.is_legacy(0.0)
    assert not Extension("z_loss", legacy=0.0).is_legacy(1e-3)


def test_an_implementation_without_the_options_runs_every_call(host: PluginHost, tmp_path: Path) -> None:
    host.register_plugin(_plugin("old", old_fwd, 0), "old")
    x, w, labels = _inputs()
    for reduction in ("mean", "none"):  # "none": a per-token cotangent
        options = {**OPTIONS, "reduction": reduction}
        got = jax.jit(jax.grad(lambda x, w, o=options: jnp.sum(_run(host, tmp_path, x, w, labels, **o) ** 2),
                               argnums=(0, 1)))(x, w)
        want = jax.grad(lambda x, w, o=options: jnp.sum(reference_linear_cross_entropy(x, w, labels, **o) ** 2),
                        argnums=(0, 1))(x, w)
        for g, r in zip(got, want, strict=True):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    assert {who for who, _ in SEEN} == {"old"}  # never refused, never passed what it does not name


def test_an_implementation_that_names_them_receives_them(host: PluginHost, tmp_path: Path) -> None:
    host.register_plugin(_plugin("old", old_fwd, 0), "old")
    host.register_plugin(_plugin("new", new_fwd, 10), "new")
    x, w, labels = _inputs()
    got = _run(host, tmp_path, x, w, labels, **OPTIONS)
    np.testing.assert_allclose(got, reference_linear_cross_entropy(x, w, labels, **OPTIONS), rtol=1e-5)
    assert SEEN[-1] == ("new", {"reduction": "sum", "label_smoothing": 0.1, "z_loss": 1e-2})
    _run(host, tmp_path, x, w, labels)
    assert SEEN[-1] == ("new", {"reduction": "mean", "label_smoothing": 0.0, "z_loss": 0.0})
