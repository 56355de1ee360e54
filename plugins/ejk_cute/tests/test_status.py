"""Status and gate facts: why the CuTe kernels cannot run, without CUTLASS, without a GPU, on old GPUs."""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Any

import jax
import pytest

from ejk.plugin import devices
from ejk_cute import _compile, _device, _status

needs_cutlass = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                   reason="nvidia-cutlass-dsl not installed")


class _Device:
    def __init__(self, capability: str, cores: int = 114) -> None:
        self.compute_capability = capability
        self.core_count = cores
        self.device_kind = "NVIDIA test GPU"


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(capability: str) -> None:
        monkeypatch.setattr(devices, "nvidia_gpu", lambda: (True, "NVIDIA test GPU"))
        monkeypatch.setattr(devices, "default_device", lambda: _Device(capability))

    return install


def test_no_cutlass_is_reported_with_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cutlass" else real(name, *a))
    reason = _status.runtime_reason()
    assert reason is not None and "nvidia-cutlass-dsl" in reason and "ejk-cute[cutlass]" in reason
    status = _status.platform_status()
    assert not status.available and "not installed" in (status.reason or "")
    assert status.fix == "pip install 'ejk-cute[cutlass]'"
    with pytest.raises(ImportError, match="ejk-cute\\[cutlass\\]"):
        _compile.import_cutlass()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the CPU answer")
def test_cpu_is_refused_with_a_reason() -> None:
    reason = _device.arch_reason()
    assert reason is not None and "sm_90" in reason and "cpu" in reason
    assert _device.compute_capability() is None
    assert _device.sm_count() == _device.HOPPER_SMS
    if _compile.cutlass_reason() is None:
        status = _status.platform_status()
        assert not status.available and status.reason == reason and status.fix


@pytest.mark.parametrize("capability", ["8.0", "8.6", "8.9", "7.5"])
def test_older_gpus_are_refused_never_crashed(fake_gpu: Any, capability: str) -> None:
    fake_gpu(capability)
    reason = _device.arch_reason()
    assert reason is not None and "sm_90+" in reason and f"sm_{capability.replace('.', '')}" in reason


@pytest.mark.parametrize("capability", ["9.0", "10.0", "12.0"])
def test_hopper_and_newer_pass(fake_gpu: Any, capability: str) -> None:
    fake_gpu(capability)
    assert _device.arch_reason() is None
    assert _device.compute_capability() == tuple(int(x) for x in capability.split("."))
    assert _device.sm_count() == 114


def test_unreadable_capability_is_refused(fake_gpu: Any) -> None:
    fake_gpu("unknown")
    assert "compute capability" in (_device.arch_reason() or "")


@needs_cutlass
def test_a_trivial_kernel_compiles_for_sm90a_on_any_host() -> None:
    """The compile path the kernel tests rely on: an export for CUDA carries one CuTe custom call."""
    import jax.numpy as jnp

    spec = importlib.util.spec_from_file_location("_copy_kernel", pathlib.Path(__file__).with_name("_copy_kernel.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    launch = module.launch

    def f(x: jax.Array) -> jax.Array:
        return _compile.cutlass_call(launch, outputs=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)  # type: ignore[no-any-return]

    exported = _compile.export_for_cuda(f, jax.ShapeDtypeStruct((128,), jnp.float32))
    assert _compile.kernel_calls(exported) == [f"{_compile.CUSTOM_CALL_TARGET}_v2"]
