"""ejk.plugin: the one module plugins import, its device facts, interpreter switches and operand VJPs."""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import ejk
import ejk.plugin
from ejk import devices
from ejk.plugin import InterpreterSwitch, operand_cotangents, operand_vjp, saving_operands


def test_every_name_is_exported() -> None:
    for name in ejk.plugin.__all__:
        assert getattr(ejk.plugin, name) is not None, name
    assert ejk.plugin.VJP is ejk.VJP and ejk.plugin.PlatformStatus is ejk.PlatformStatus


def test_the_old_public_paths_name_the_same_objects() -> None:
    """Plugins written against ``ejk.hookimpl``, ``ejk.config.validators``, ``ejk.tiling``, … keep working."""
    import ejk.config.validators
    import ejk.plugins
    import ejk.tiling

    same = [(ejk.plugin.hookimpl, ejk.hookimpl), (ejk.plugin.Tier, ejk.Tier), (ejk.plugin.Backend, ejk.Backend),
            (ejk.plugin.Platform, ejk.Platform), (ejk.plugin.Invocation, ejk.Invocation),
            (ejk.plugin.Kernel, ejk.Kernel), (ejk.plugin.probe_platform, ejk.plugins.probe_platform),
            (ejk.plugin.int_in, ejk.config.validators.int_in), (ejk.plugin.cdiv, ejk.tiling.cdiv),
            (ejk.plugin.devices, devices)]
    assert all(new is old for new, old in same)


def test_the_register_callback_type_has_the_registry_parameters() -> None:
    protocol = inspect.signature(ejk.plugin.RegisterKernels.__call__)
    registry = inspect.signature(ejk.KernelRegistry.register)
    assert list(protocol.parameters) == list(registry.parameters)
    assert [p.default for p in protocol.parameters.values()] == [p.default for p in registry.parameters.values()]


class _Gpu:
    def __init__(self, capability: str, cores: Any = 114) -> None:
        self.compute_capability = capability
        self.core_count = cores


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, capability: str, cores: Any = 114) -> None:
    monkeypatch.setattr(devices, "nvidia_gpu", lambda: (True, "NVIDIA test GPU"))
    monkeypatch.setattr(devices, "default_device", lambda: _Gpu(capability, cores))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the CPU answers")
def test_without_a_gpu_the_facts_are_hoppers() -> None:
    on_gpu, why = devices.nvidia_gpu()
    assert not on_gpu and "cpu" in why
    assert devices.compute_capability() is None
    assert devices.sm_count() == devices.HOPPER_SMS == 132
    assert devices.smem_per_block() == devices.HOPPER_SMEM_BYTES == 227 * 1024


@pytest.mark.parametrize(("capability", "found", "smem_kib"), [
    ("9.0", (9, 0), 227), ("8.0", (8, 0), 163), ("8.6", (8, 6), 99), ("12.0", (12, 0), 99),
])
def test_a_gpu_reports_its_capability_and_shared_memory(monkeypatch: pytest.MonkeyPatch, capability: str,
                                                        found: tuple[int, int], smem_kib: int) -> None:
    _fake_gpu(monkeypatch, capability)
    assert devices.compute_capability() == found
    assert devices.smem_per_block() == smem_kib * 1024
    assert devices.sm_count() == 114


def test_a_gpu_that_does_not_say_gets_hoppers_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpu(monkeypatch, "unknown", cores=None)
    assert devices.compute_capability() is None
    assert devices.sm_count() == devices.HOPPER_SMS
    assert devices.smem_per_block() == devices.HOPPER_SMEM_BYTES


@pytest.mark.parametrize(("value", "on"), [("1", True), ("TRUE", True), (" yes ", True), ("on", True),
                                           ("0", False), ("", False), ("off", False)])
def test_an_interpreter_switch_reads_its_variable(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    switch = InterpreterSwitch("EJK_TEST_INTERPRET")
    monkeypatch.setenv("EJK_TEST_INTERPRET", value)
    assert switch.requested() is on
    assert switch.backends() == (("gpu", "cpu") if on else ("gpu",))
    monkeypatch.setattr(devices, "nvidia_gpu", lambda: (False, "no GPU"))
    assert switch.active() is on
    monkeypatch.setattr(devices, "nvidia_gpu", lambda: (True, "NVIDIA test GPU"))
    assert switch.active() is False  # on a GPU the kernels run compiled


def test_an_unset_switch_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EJK_TEST_INTERPRET", raising=False)
    assert not InterpreterSwitch("EJK_TEST_INTERPRET").requested()


def _scale(a: jax.Array, b: jax.Array, *, factor: float = 1.0) -> jax.Array:
    return a * b * factor


def _scale_gradients(operands: tuple[jax.Array, ...], d_out: jax.Array, *, factor: float = 1.0) -> tuple[Any, ...]:
    _, b = operands
    return d_out * b * factor, None


def test_an_operand_vjp_saves_the_operands_and_keeps_none_cotangents() -> None:
    fwd, bwd = saving_operands(_scale), operand_cotangents(_scale_gradients)
    a, b = jnp.arange(3.0), jnp.full(3, 2.0)
    out, residuals = fwd(a, b, factor=3.0)
    assert jnp.array_equal(out, a * b * 3.0) and residuals[0] is a and residuals[1] is b
    da, db = bwd(residuals, jnp.ones(3), factor=3.0)
    assert jnp.array_equal(da, jnp.full(3, 6.0)) and db is None
    assert fwd.__name__ == "forward_with_residuals" and bwd.__name__ == "backward"
    assert list(inspect.signature(fwd).parameters) == ["a", "b", "factor"]


def test_an_operand_vjp_runs_as_an_implementations_vjp() -> None:
    registry = ejk.KernelRegistry()
    vjp = operand_vjp(_scale, _scale_gradients, ejk.plugin.MATMUL_RESIDUALS)
    assert isinstance(vjp, ejk.VJP) and not vjp.paired and vjp.residuals == "matmul:inputs"
    registry.register("scale", "xla", "any", vjp=vjp)(_scale)
    assert registry.get_spec("scale").vjp is vjp
    assert vjp.bwd is not None
    bwd = vjp.bwd

    @jax.custom_vjp
    def scaled(a: jax.Array, b: jax.Array) -> jax.Array:
        return _scale(a, b, factor=3.0)

    scaled.defvjp(lambda a, b: vjp.fwd(a, b, factor=3.0), lambda res, d: bwd(res, d, factor=3.0))
    a, b = jnp.arange(3.0), jnp.full(3, 2.0)
    assert jnp.array_equal(jax.grad(lambda a, b: scaled(a, b).sum())(a, b), jnp.full(3, 6.0))


def test_the_matmul_residual_tags_are_the_shipped_plugins() -> None:
    """Backwards pair across plugins by equal tags: these strings are what every installed matmul declares."""
    assert (ejk.plugin.MATMUL_RESIDUALS, ejk.plugin.GROUPED_MATMUL_RESIDUALS) == ("matmul:inputs",
                                                                                  "grouped_matmul:inputs")


def test_operand_cotangents_sum_a_replicated_operand_over_the_mesh() -> None:
    """Under ``shard_map`` a replicated operand's cotangent is summed over the axes it does not vary along,
    so it is replicated too (``out_specs=P()`` with ``check_vma`` accepts nothing else)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((1,), ("x",))
    bwd = operand_cotangents(lambda operands, d: (d * operands[1], d * operands[0]))
    fn = jax.jit(jax.shard_map(lambda a, b, d: bwd((a, b), d), mesh=mesh, in_specs=(P("x"), P(), P("x")),
                               out_specs=(P("x"), P()), check_vma=True))
    a, b, d = (jax.device_put(x, NamedSharding(mesh, spec))
               for x, spec in ((jnp.arange(4.0), P("x")), (jnp.full(4, 2.0), P()), (jnp.ones(4), P("x"))))
    da, db = fn(a, b, d)
    assert jnp.array_equal(da, b) and jnp.array_equal(db, a)
