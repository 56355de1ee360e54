"""The status hooks of the real platform plugins on this machine (a CPU-only JAX in CI).

Loaded through their installed entry points into a private PluginHost. ejk-xla's status is
checked in test_integration.py together with its kernels.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import jax
import pytest

from ejk.plugins import PlatformStatus, PluginHost
from ejk.registry import KernelRegistry

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the CPU-only statuses")

GPU_PLUGINS = {"pallas": "ejk-pallas", "triton": "ejk-triton", "cute": "ejk-cute"}


@pytest.fixture(scope="module")
def host() -> PluginHost:
    eps = [ep for ep in importlib.metadata.entry_points(group="ejk") if ep.name in GPU_PLUGINS]
    assert sorted(ep.name for ep in eps) == sorted(GPU_PLUGINS)
    host = PluginHost(KernelRegistry(), load_entry_points=False)
    with pytest.MonkeyPatch.context() as mp:  # whatever the caller's shell says
        mp.delenv("EJK_PLUGINS", raising=False)
        mp.delenv("EJK_DISABLE_PLUGINS", raising=False)
        host.load_entry_points(eps)
    return host


@pytest.mark.parametrize("name", sorted(GPU_PLUGINS))
def test_plugin_loads_from_its_distribution(host: PluginHost, name: str) -> None:
    info = host.plugins[name]
    assert info.status == "loaded", info.error
    assert info.distribution == GPU_PLUGINS[name]
    assert info.version == importlib.metadata.version(GPU_PLUGINS[name])
    assert info.hook_errors == []


@pytest.mark.parametrize("name", sorted(GPU_PLUGINS))
def test_gpu_platforms_report_themselves_unavailable_on_the_cpu(host: PluginHost, name: str) -> None:
    status = host.platform_statuses()[name]
    assert isinstance(status, PlatformStatus)
    assert status.available is False
    assert status.reason and status.fix
    available, reason = host.registry.platform_available(name)
    assert available is False and status.reason in (reason or "")


def test_pallas_status_explains_interpret_mode(host: PluginHost) -> None:
    status = host.platform_statuses()["pallas"]
    assert "JAX's default backend is cpu" in (status.reason or "")
    assert "interpret" in (status.fix or "")
    assert dict(status.versions).get("jax") == jax.__version__


def test_triton_status_names_what_to_install(host: PluginHost) -> None:
    status = host.platform_statuses()["triton"]
    missing = [d for m, d in (("triton", "triton"), ("jax_triton", "jax-triton"))
               if importlib.util.find_spec(m) is None]
    if missing:
        assert status.reason == f"{', '.join(missing)} not installed"
        assert status.fix == f"pip install {' '.join(missing)}"
    else:
        assert "default backend is cpu" in (status.reason or "")


def test_cute_status_names_what_to_install(host: PluginHost) -> None:
    status = host.platform_statuses()["cute"]
    if importlib.util.find_spec("cutlass") is None:
        assert (status.reason or "").startswith("nvidia-cutlass-dsl not installed")
        assert status.fix == "pip install 'ejk-cute[cutlass]'"
    else:
        assert "default backend is cpu" in (status.reason or "")


def test_auto_never_picks_an_unavailable_platform(host: PluginHost) -> None:
    def gpu_kernel(x: object) -> str:
        return "gpu"

    def portable_kernel(x: object) -> str:
        return "xla"

    registry = host.registry
    for name in GPU_PLUGINS:
        registry.register("probe_op", name, "any", priority=10)(gpu_kernel)
    registry.register("probe_op", "xla", "any")(portable_kernel)
    assert registry.get("probe_op", platform="auto") is portable_kernel
    assert registry.get("probe_op") is gpu_kernel
