"""The op contract, enforced (issue 28): a label belongs to the plugin that registered it first, an
implementation whose signature cannot take its op's call is refused at registration, and one whose
output differs from the op's declared output is refused when traced — each reported against its plugin."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.plugins
from ejk.errors import KernelContractError, KernelNotFoundError
from ejk.ops import ImplChoice, MatmulKernel, OpKernel, define_op, run_op
from ejk.plugins import PlatformStatus, PluginHost


def _plugin(registrations: Any) -> object:
    class Plugin:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            registrations(register)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="acme", available=True)

    return Plugin()


def good_matmul(a: jax.Array, b: jax.Array, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> Any:
    return jnp.matmul(a, b, precision=precision).astype(preferred_element_type)


def zeros_matmul(a: jax.Array, b: jax.Array, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> Any:
    return jnp.zeros((a.shape[0], b.shape[1]), preferred_element_type)


@pytest.fixture
def host() -> PluginHost:
    return ejk.plugins.get_plugin_host()  # the private, empty host of conftest


def _run(kernel: OpKernel, tmp_path: Path, a: Any, b: Any, **options: Any) -> Any:
    executor = ejk.Executor(ejk.ConfigSelectorChain(persistent_dir=tmp_path))
    arrays, static = kernel.normalize(a, b)
    with ejk.use_executor(executor):
        return run_op(kernel, arrays, static, options.pop("platform", "auto"), options.pop("cfg", None))


def _ab() -> tuple[jax.Array, jax.Array]:
    return jnp.ones((4, 8), jnp.float32), jnp.ones((8, 4), jnp.float32)


# -- 1: labels belong to one plugin; an implementation is addressable by plugin --------------------------


def test_a_squatted_label_leaves_the_owner_reachable(host: PluginHost, tmp_path: Path) -> None:
    host.register_plugin(_plugin(lambda r: r("matmul", "acme", "any", name="tiled")(good_matmul)), "owner")
    with pytest.warns(RuntimeWarning, match="plugin owner already registered acme/any:tiled"):
        host.register_plugin(_plugin(lambda r: r("matmul", "acme", "any", name="tiled", priority=50)(zeros_matmul)),
                             "squatter")
    kernel = MatmulKernel(host.registry)
    a, b = _ab()
    np.testing.assert_allclose(_run(kernel, tmp_path, a, b, platform="acme"), 8.0)
    choice = ImplChoice(platform="acme", backend="any", implementation="tiled", plugin="owner")
    np.testing.assert_allclose(_run(kernel, tmp_path, a, b, cfg=choice), 8.0)
    assert any("refused" in e for e in host.plugins["squatter"].hook_errors)
    with pytest.raises(KernelNotFoundError, match="registered by plugin owner, not by plugin squatter"):
        kernel.spec_for(ImplChoice(platform="acme", backend="any", implementation="tiled", plugin="squatter"))


def test_an_impl_choice_reads_a_label_with_its_plugin() -> None:
    assert ImplChoice.from_label("acme-kernels:acme/any:tiled") == ImplChoice(
        platform="acme", backend="any", implementation="tiled", plugin="acme-kernels")
    assert ImplChoice.from_label("xla/gpu", cfg=3) == ImplChoice(platform="xla", backend="gpu", cfg=3)
    assert str(ImplChoice.from_label("p:xla/any:chunked")).startswith("p:xla/any:chunked")
    with pytest.raises(ValueError, match=r"\[plugin:\]platform/backend\[:name\]"):
        ImplChoice.from_label("chunked")


# -- 2: a signature that cannot take the op's call is refused at registration --------------------------


def wrong_matmul(x: jax.Array, y: jax.Array, *, precision: Any, cfg: Any = None) -> Any:
    return x @ y


def test_a_wrong_signature_is_refused_at_registration_against_its_plugin(host: PluginHost, tmp_path: Path) -> None:
    with pytest.warns(RuntimeWarning, match="matmul acme/any:mm of plugin wrong is refused"):
        info = host.register_plugin(_plugin(lambda r: (r("matmul", "acme", "any", name="mm", priority=99)(wrong_matmul),
                                                       r("matmul", "acme", "any", name="ok")(good_matmul))), "wrong")
    assert [s.name for s in host.registry.list_implementations("matmul")] == ["ok"]
    (error,) = info.hook_errors
    assert "preferred_element_type" in error and "wrong_matmul" in error
    a, b = _ab()
    np.testing.assert_allclose(_run(MatmulKernel(host.registry), tmp_path, a, b), 8.0)  # auto never sees it


def test_a_wrong_backward_signature_is_refused(host: PluginHost) -> None:
    def fwd(a: Any, b: Any, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> Any:
        return good_matmul(a, b, precision=precision, preferred_element_type=preferred_element_type), (a, b)

    def bwd(residuals: Any, cotangent: Any) -> Any:
        return residuals

    vjp = ejk.VJP(fwd=fwd, bwd=bwd, residuals="acme")
    with pytest.warns(RuntimeWarning, match="its VJP bwd .* cannot be called as bwd"):
        host.register_plugin(_plugin(lambda r: r("matmul", "acme", "any", vjp=vjp)(good_matmul)), "bwd")
    assert not host.registry.list_implementations("matmul")


def test_outside_a_plugin_a_wrong_signature_raises() -> None:
    registry = ejk.KernelRegistry()
    with pytest.raises(KernelContractError, match="cannot be called as impl"):
        registry.register("matmul", "acme", "any")(wrong_matmul)


class _LateKernel(OpKernel):
    op_id = "late_contract_op"
    version = "1"
    array_names = ("x",)
    positional = 1

    def normalize(self, x: Any, *, scale: float = 1.0) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (x,), {"scale": float(scale)}


def test_an_op_defined_after_the_registration_checks_it_then(host: PluginHost) -> None:
    def fine(x: Any, *, scale: float, cfg: Any = None) -> Any:
        return x * scale

    def unscaled(x: Any, *, cfg: Any = None) -> Any:
        return x

    host.register_plugin(_plugin(lambda r: (r("late_contract_op", "acme", "any", name="fine")(fine),
                                            r("late_contract_op", "acme", "any", name="bad")(unscaled))), "late")
    assert len(host.registry.list_implementations("late_contract_op")) == 2  # no contract yet: nothing to check
    kernel = _LateKernel(host.registry)
    define_op(kernel, lambda x, **kw: x)
    with pytest.warns(RuntimeWarning, match="late_contract_op acme/any:bad of plugin late .* unexpected keyword"):
        names = [s.name for s in host.registry.list_implementations("late_contract_op")]
    assert names == ["fine"]
    assert any("acme/any:bad" in e for e in host.plugins["late"].hook_errors)


# -- 4: an output of the wrong shape or dtype is refused, naming the plugin -------------------------------


@pytest.mark.parametrize(("returned", "needle"), [
    (lambda a, b: jnp.matmul(a, b).astype(jnp.float16), "float16[4,4]"),
    (lambda a, b: jnp.matmul(a, b)[:, :1], "float32[4,1]"),
])
def test_a_wrong_output_is_refused_naming_its_plugin(host: PluginHost, tmp_path: Path, returned: Any,
                                                      needle: str) -> None:
    def bad(a: Any, b: Any, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> Any:
        return returned(a, b)

    host.register_plugin(_plugin(lambda r: r("matmul", "acme", "any")(bad)), "shapeless")
    a, b = _ab()
    wanted = rf"matmul acme/any of plugin shapeless returned {re.escape(needle)}, but the op's output for this call"
    with pytest.raises(KernelContractError, match=wanted + r" .* is float32\[4,4\]"):
        _run(MatmulKernel(host.registry), tmp_path, a, b)
    with pytest.raises(KernelContractError, match="of plugin shapeless"):
        jax.grad(lambda a: _run(MatmulKernel(host.registry), tmp_path, a, b).sum())(a)


# -- 15: an ImplChoice without a config runs its implementation's heuristic config, forward and backward ----


@pytest.fixture
def seen() -> list[tuple[str, Any]]:
    return []


def test_an_impl_choice_without_config_uses_its_heuristic_forward_and_backward(
        host: PluginHost, tmp_path: Path, seen: list[tuple[str, Any]]) -> None:
    def fwd(a: Any, b: Any, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> Any:
        seen.append(("fwd", cfg))
        return good_matmul(a, b, precision=precision, preferred_element_type=preferred_element_type), (a, b)

    def bwd(residuals: Any, d_out: Any, *, cfg: Any = None, **static: Any) -> Any:
        seen.append(("bwd", cfg))
        a, b = residuals
        return d_out @ b.T, a.T @ d_out

    vjp = ejk.VJP(fwd=fwd, bwd=bwd, residuals="acme")
    host.register_plugin(_plugin(lambda r: r("matmul", "acme", "any", name="tiled", cfg_type=int,
                                             heuristic=lambda **call: 7, vjp=vjp)(good_matmul)), "acme")
    a, b = _ab()
    choice = ImplChoice(platform="acme", backend="any", implementation="tiled")
    jax.grad(lambda a: _run(MatmulKernel(host.registry), tmp_path, a, b, cfg=choice).sum())(a)
    assert seen == [("fwd", 7), ("bwd", 7)]


class Shared(int):
    """A config class two implementations share."""


def test_a_shared_config_class_picks_an_available_implementation(host: PluginHost, tmp_path: Path) -> None:
    class Down:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("matmul", "down", "any", priority=10, cfg_type=Shared)(zeros_matmul)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="down", available=False, reason="no device")

    host.register_plugin(Down(), "down")
    host.register_plugin(_plugin(lambda r: r("matmul", "acme", "any", cfg_type=Shared)(good_matmul)), "acme")
    assert MatmulKernel(host.registry).choice_for(Shared(3), "auto").platform == "acme"
    a, b = _ab()
    np.testing.assert_allclose(_run(MatmulKernel(host.registry), tmp_path, a, b, cfg=Shared(3)), 8.0)


def test_an_op_whose_contract_cannot_be_computed_checks_nothing_and_warns(host: PluginHost) -> None:
    class Broken(_LateKernel):
        op_id = "broken_contract_op"

    def broken_samples() -> Any:
        raise RuntimeError("no samples today")

    define_op(Broken(host.registry), lambda x, **kw: x, samples=broken_samples)
    with pytest.warns(RuntimeWarning, match="broken_contract_op: its call contract could not be computed"):
        host.register_plugin(_plugin(lambda r: r("broken_contract_op", "acme", "any")(lambda x, *, cfg=None: x)),
                             "any")
    assert len(host.registry.list_implementations("broken_contract_op")) == 1


def test_the_declared_outputs_follow_the_value_head_dim() -> None:
    from ejk.ops import OPS
    from ejk.testing import paged_batch

    q, k_pages, v_pages, *rest = paged_batch(d=24)
    v_pages = v_pages[..., :12]  # Dv != D
    definition = OPS["ragged_paged_attention"]
    arrays, static = definition.kernel.normalize(q, k_pages, v_pages, *rest)
    assert definition.output_fn()(*arrays, **static).shape == (q.shape[0], q.shape[1], 12)  # type: ignore[misc]
