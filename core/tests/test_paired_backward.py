"""Forward-only implementations (``ejk.VJP`` without ``bwd``): the core runs another implementation's
backward of the same residual tag, and the registered gate refuses calls no backward pairs with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.plugins
from ejk._plugins_cli import implementation_rows
from ejk.ops import ImplChoice, OpKernel
from ejk.plugins import PlatformStatus, PluginHost

X = jnp.linspace(-1.0, 1.0, 24, dtype=jnp.float32).reshape(4, 6)
TAG = "square:x"


class SquareKernel(OpKernel):
    """``square(x, *, limit)``: ``x * x``; gates may refuse a large ``limit``."""

    op_id = "square"
    version = "1"
    array_names = ("x",)
    positional = 1

    def normalize(self, x: Any, *, limit: int = 0) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (x,), {"limit": int(limit)}


def square(x: jax.Array, *, limit: int, cfg: Any) -> jax.Array:
    return x * x


def square_fwd(x: jax.Array, *, limit: int, cfg: Any) -> tuple[jax.Array, Any]:
    return x * x, (x,)


def bwd_plus(offset: float) -> Callable[..., tuple[jax.Array]]:
    """A correct backward plus ``offset``: which implementation's backward ran shows in the gradient."""

    def bwd(residuals: Any, g: jax.Array, *, limit: int, cfg: Any) -> tuple[jax.Array]:
        (x,) = residuals
        return (2 * x * g + offset,)

    return bwd


def refuses_above(n: int) -> Callable[..., str | None]:
    return lambda x, *, limit: f"limit {limit} > {n} not supported" if limit > n else None


FORWARD_ONLY = dict(priority=10, name="fo", vjp=ejk.VJP(fwd=square_fwd, residuals=TAG))


def _plugin(name: str, registrations: Callable[[Any], None], platform: str, available: bool = True) -> object:
    class Plugin:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            registrations(register)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform=platform, available=available,
                                  reason=None if available else "no such device", fix="buy one")

    Plugin.__name__ = name
    return Plugin()


@pytest.fixture
def host() -> PluginHost:
    return ejk.plugins.get_plugin_host()  # the private, empty host of conftest


def install(host: PluginHost, name: str, platform: str, registrations: Callable[[Any], None],
            available: bool = True) -> SquareKernel:
    host.register_plugin(_plugin(name, registrations, platform, available), name)
    return SquareKernel(host.registry)


def forward_only(host: PluginHost, **options: Any) -> SquareKernel:
    """``xla/any:fo`` (priority 10), forward-only, from plugin ``fwdonly``."""
    options = {**FORWARD_ONLY, **options}
    return install(host, "fwdonly", "xla", lambda reg: reg("square", "xla", "any", **options)(square))


def full(name: str, offset: float, *, platform: str = "xla", backend: str = "any", priority: int = 0,
         tag: str = TAG, capability: Any = None) -> Callable[[Any], None]:
    def register(reg: Any) -> None:
        reg("square", platform, backend, priority=priority, name=name, capability=capability,
            vjp=ejk.VJP(fwd=square_fwd, bwd=bwd_plus(offset), residuals=tag))(square)

    return register


def executor(tmp_path: Path, events: list[Any] | None = None) -> ejk.Executor[Any, Any]:
    chain: ejk.ConfigSelectorChain[Any] = ejk.ConfigSelectorChain(
        policy=ejk.AutotunePolicy(mode="heuristics"), persistent_dir=tmp_path / "cache",
        on_event=(events if events is not None else []).append)
    return ejk.Executor(chain)


def grad(run: ejk.Executor[Any, Any], kernel: SquareKernel, x: jax.Array = X, **kwargs: Any) -> jax.Array:
    kwargs.setdefault("platform", "auto")
    return jax.grad(lambda x: run(kernel, x, limit=kwargs.pop("limit", 0), **kwargs).sum())(x)


def spec_of(host: PluginHost, name: str) -> Any:
    (spec,) = [s for s in host.registry.list_implementations("square") if s.name == name]
    return spec


def test_gradients_of_a_forward_only_implementation_are_its_partners(host: PluginHost, tmp_path: Path) -> None:
    kernel = forward_only(host)
    install(host, "full", "xla", full("full", 1000.0))
    events: list[Any] = []
    run = executor(tmp_path, events)
    got = grad(run, kernel)
    assert events[0].cfg.implementation == "fo"  # auto chose the forward-only one (highest priority)
    partner = grad(run, kernel, cfg=ImplChoice(platform="xla", backend="any", implementation="full"))
    np.testing.assert_allclose(got, 2 * X + 1000.0, rtol=1e-6)
    np.testing.assert_allclose(got, partner, rtol=1e-6)
    np.testing.assert_allclose(run(kernel, X, limit=0, platform="auto"), X * X)
    # under jit and vmap too: the pairing travels with the residuals (no leaves of its own)
    jitted = jax.jit(jax.vmap(jax.grad(lambda x: run(kernel, x, limit=0, platform="auto").sum())))(X[None])
    np.testing.assert_allclose(jitted[0], 2 * X + 1000.0, rtol=1e-6)


def test_without_a_partner_the_gate_refuses_with_the_reason(host: PluginHost, tmp_path: Path) -> None:
    kernel = forward_only(host)
    install(host, "other", "xla", full("other", 0.0, tag="square:other"))
    reason = spec_of(host, "fo").capability(x=jax.ShapeDtypeStruct(X.shape, X.dtype), limit=0)
    assert reason is not None and reason.startswith("no installed backward pairs with it for gradients (")
    assert "xla/any:fo has no backward of its own" in reason and repr(TAG) in reason
    assert "none is installed" in reason and "Install a plugin" in reason
    # auto takes the implementation whose gradients work; explain says why not the forward-only one
    events: list[Any] = []
    run = executor(tmp_path, events)
    np.testing.assert_allclose(grad(run, kernel), 2 * X, rtol=1e-6)
    assert events[0].cfg.implementation == "other"
    found = ejk.explain(kernel, X, limit=0, executor=run)
    (report,) = [r for r in found.implementations if r.label == "xla/any:fo"]
    assert report.status == "refused" and report.reason == reason
    assert report.backward == f"paired by residuals {TAG!r}"
    with pytest.raises(ValueError, match="no installed backward pairs"):
        run(kernel, X, limit=0, platform="auto", cfg=ImplChoice(platform="xla", backend="any", implementation="fo"))


def test_the_plugins_own_gate_speaks_first_and_its_fix_ends_the_reason(host: PluginHost) -> None:
    forward_only(host, capability=refuses_above(4), vjp=ejk.VJP(fwd=square_fwd, residuals=TAG, fix="pip install x"))
    gate = spec_of(host, "fo").capability
    x = jax.ShapeDtypeStruct(X.shape, X.dtype)
    assert gate(x=x, limit=9) == "limit 9 > 4 not supported"
    reason = gate(x=x, limit=0)
    assert reason is not None and reason.endswith("none is installed). pip install x)")


def test_a_partner_on_another_backend_or_refusing_the_call_is_skipped(host: PluginHost, tmp_path: Path) -> None:
    kernel = forward_only(host)
    install(host, "tpuonly", "xla", full("tpu", 1.0, backend="tpu", priority=9))
    install(host, "picky", "xla", full("picky", 2.0, priority=8, capability=refuses_above(4)))
    install(host, "fallback", "xla", full("fallback", 3.0, priority=1))
    run = executor(tmp_path)
    np.testing.assert_allclose(grad(run, kernel), 2 * X + 2.0, rtol=1e-6)  # picky accepts limit 0
    np.testing.assert_allclose(grad(run, kernel, limit=9), 2 * X + 3.0, rtol=1e-6)
    host.registry.unregister_plugin("fallback")
    reason = spec_of(host, "fo").capability(x=jax.ShapeDtypeStruct(X.shape, X.dtype), limit=9)
    assert reason is not None
    assert "xla/tpu:tpu: targets tpu, not JAX's default backend cpu" in reason
    assert "xla/any:picky: limit 9 > 4 not supported" in reason


def test_an_available_partner_wins_over_an_unavailable_one_taken_only_as_a_fallback(
        host: PluginHost, tmp_path: Path) -> None:
    kernel = forward_only(host)
    install(host, "interp", "gone", full("interp", 5.0, platform="gone", priority=9), available=False)
    install(host, "avail", "xla", full("avail", 6.0, priority=1))
    run = executor(tmp_path)
    np.testing.assert_allclose(grad(run, kernel), 2 * X + 6.0, rtol=1e-6)
    host.registry.unregister_plugin("avail")  # an interpreter mode on a CPU: unavailable, but its gate accepts
    np.testing.assert_allclose(grad(executor(tmp_path / "2"), kernel), 2 * X + 5.0, rtol=1e-6)


def test_an_explicit_backward_choice_still_wins(host: PluginHost, tmp_path: Path) -> None:
    kernel = forward_only(host)
    install(host, "full", "xla", full("full", 1000.0, priority=5))
    install(host, "named", "xla", full("named", 7.0))
    run = executor(tmp_path)
    named = ImplChoice(platform="xla", backend="any", implementation="named")
    choice = ImplChoice(platform="xla", backend="any", implementation="fo", backward=named)
    np.testing.assert_allclose(grad(run, kernel, cfg=choice), 2 * X + 7.0, rtol=1e-6)
    # a forward-only implementation cannot be named as someone's backward
    bad = ImplChoice(platform="xla", backend="any", implementation="named",
                     backward=ImplChoice(platform="xla", backend="any", implementation="fo"))
    with pytest.raises(ValueError, match="backward xla/any:fo has no backward of its own"):
        run(kernel, X, limit=0, platform="auto", cfg=bad)


def test_listings_say_the_backward_is_paired(host: PluginHost, tmp_path: Path) -> None:
    kernel = forward_only(host)
    install(host, "full", "xla", full("full", 0.0))
    found = ejk.explain(kernel, X, limit=0, executor=executor(tmp_path))
    by_label = {r.label: r for r in found.implementations}
    assert by_label["xla/any:fo"].status == "chosen"
    assert by_label["xla/any:fo"].backward == f"paired by residuals {TAG!r}: xla/any:full"
    assert by_label["xla/any:full"].backward is None
    (row,) = implementation_rows(host, "fwdonly")
    assert row["backward"] == f"paired by residuals {TAG!r}" and row["gated"]
    assert implementation_rows(host, "full")[0]["backward"] == "own"


def test_vjp_declarations() -> None:
    paired = ejk.VJP(fwd=square_fwd, residuals=TAG)
    assert paired.paired and paired.bwd is None and paired.describe_backward() == f"paired by residuals {TAG!r}"
    own = ejk.VJP(fwd=square_fwd, bwd=bwd_plus(0.0), residuals=TAG)
    assert not own.paired and own.describe_backward() == "own"
    with pytest.raises(ValueError, match=r"fix=.*forward-only"):
        ejk.VJP(fwd=square_fwd, bwd=bwd_plus(0.0), residuals=TAG, fix="pip install x")
    with pytest.raises(ValueError, match="residuals"):
        ejk.VJP(fwd=square_fwd, residuals="")


def test_provenance_records_every_distribution_a_choice_runs(host: PluginHost) -> None:
    from importlib.metadata import version

    # any installed distributions stand for the plugins' own
    host.register_plugin(_plugin("fwdonly", lambda reg: reg("square", "xla", "any", **FORWARD_ONLY)(square), "xla"),
                         "fwdonly", distribution="pytest")
    host.register_plugin(_plugin("full", full("full", 0.0), "xla"), "full", distribution="pluggy")
    host.register_plugin(_plugin("other", full("other", 0.0, tag="square:other"), "xla"), "other",
                         distribution="attrs")
    kernel = SquareKernel(host.registry)
    fo = ImplChoice(platform="xla", backend="any", implementation="fo")
    # the forward's, and that of every backward it may pair with (not the other residual tag's)
    assert kernel.cfg_versions(fo) == {"pytest": version("pytest"), "pluggy": version("pluggy")}
    other = ImplChoice(platform="xla", backend="any", implementation="other")
    assert kernel.cfg_versions(other) == {"attrs": version("attrs")}  # a backward of its own: its alone
    named = ImplChoice(platform="xla", backend="any", implementation="fo",
                       backward=ImplChoice(platform="xla", backend="any", implementation="full"))
    assert kernel.cfg_versions(named) == {"pytest": version("pytest"), "pluggy": version("pluggy")}
