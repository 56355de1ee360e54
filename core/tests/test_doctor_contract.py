"""``ejk doctor`` and ``ejk.testing.check_plugin`` hold every implementation to its op's contract
(issue 28): signatures are compared with the op's declared call (not with another plugin's
implementation), and each implementation's gate, heuristic, config space and abstract output run on
the op's sample calls. The "Writing a plugin" example of the docs passes."""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import ejk
import ejk.plugins
from ejk import cli
from ejk.plugins import PlatformStatus, PluginHost
from ejk.testing import ConformanceError, check_plugin

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def host() -> PluginHost:
    return ejk.plugins.get_plugin_host()  # the private, empty host of conftest


def _plugin(registrations: Any, platform: str = "acme") -> object:
    class Plugin:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            registrations(register)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform=platform, available=True)

    return Plugin()


def loose(a: jax.Array, b: jax.Array, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> jax.Array:
    return jnp.matmul(a, b, precision=precision).astype(preferred_element_type)


def as_documented(a: jax.Array, b: jax.Array, *, precision: tuple[str, str], preferred_element_type: Any,
                  cfg: Any = None) -> jax.Array:
    return jnp.matmul(a, b, precision=precision).astype(preferred_element_type)


def _doctor(capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """The exit status and the problems ``ejk doctor`` lists (each one line, however the console wraps it)."""
    status = cli.main(["doctor"])
    text = " ".join(capsys.readouterr().out.split())
    return status, [p.split(" cache directory:")[0].strip() for p in text.split("problem: ")[1:]]


def test_doctor_compares_each_signature_with_the_ops_contract(host: PluginHost,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    host.register_plugin(_plugin(lambda r: r("matmul", "acme", "any", priority=9, name="loose")(loose)), "first")
    host.register_plugin(_plugin(lambda r: r("matmul", "acme", "any", name="doc")(as_documented)), "second")
    assert _doctor(capsys) == (0, [])  # the documented annotation blames nobody


def test_doctor_reports_a_wrong_output_and_a_broken_heuristic(host: PluginHost,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    def half(a: Any, b: Any, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> jax.Array:
        return jnp.matmul(a, b).astype(jnp.float16)

    def broken(**call: Any) -> Any:
        raise RuntimeError("no heuristic today")

    host.register_plugin(_plugin(lambda r: r("matmul", "acme", "any", name="half")(half)), "halves")
    host.register_plugin(_plugin(lambda r: r("matmul", "acme", "any", name="lazy", heuristic=broken)(loose)), "lazy")
    status, problems = _doctor(capsys)
    assert status == 1
    assert any("plugin halves: matmul acme/any:half on the sample call" in p and "returned float16[128,128]" in p
               for p in problems), problems
    assert any("plugin lazy: matmul acme/any:lazy" in p and "heuristic raised RuntimeError" in p for p in problems)


def test_the_writing_a_plugin_example_passes_the_doctor(host: PluginHost, make_module: Callable[[str], str],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "docs" / "writing_plugins.md").read_text(encoding="utf-8")
    (source,) = [block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "ejk_register_kernels" in block]
    host.register_plugin(importlib.import_module(make_module(source)), "mykernels")
    assert [s.label for s in host.registry.list_implementations("matmul")] == ["mykernels/gpu:tiled"]
    assert _doctor(capsys) == (0, [])


# -- check_plugin ----------------------------------------------------------------------------------------

OWNER = '''
import ejk, jax.numpy as jnp

def tiled(a, b, *, precision, preferred_element_type, cfg=None):
    return jnp.matmul(a, b).astype(preferred_element_type)

@ejk.hookimpl
def ejk_register_kernels(register):
    register("matmul", "acme", "any", name="tiled")(tiled)

@ejk.hookimpl
def ejk_platform_status():
    return ejk.PlatformStatus(platform="acme", available=True)
'''

SQUATTER = OWNER.replace('name="tiled"', 'name="tiled", priority=50')

HALF = OWNER.replace("astype(preferred_element_type)", "astype(jnp.float16)")

WRONG_HEURISTIC = OWNER.replace('name="tiled")', 'name="tiled", cfg_type=int, heuristic=lambda **c: "big")')


@pytest.fixture
def installed(make_module: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    def install(**sources: str) -> None:
        eps = [importlib.metadata.EntryPoint(name=name, value=make_module(source), group="ejk")
               for name, source in sources.items()]
        monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: eps)

    return install


def test_check_plugin_refuses_a_squatter_and_passes_the_owner(installed: Any) -> None:
    installed(owner=OWNER, squatter=SQUATTER)  # ejk loads plugins in the order of their names
    check_plugin("owner")
    with pytest.raises(ConformanceError, match=r"plugin squatter registrations were refused: .*plugin owner already"):
        check_plugin("squatter")


@pytest.mark.parametrize(("source", "needle"), [
    (HALF, "returned float16[128,128]"),
    (WRONG_HEURISTIC, "its heuristic returned str where int is expected"),
])
def test_check_plugin_runs_each_implementation_on_the_sample_calls(installed: Any, source: str, needle: str) -> None:
    installed(careless=source)
    with pytest.raises(ConformanceError, match=re.escape(needle)):
        check_plugin("careless")
