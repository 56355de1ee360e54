"""Entry-point discovery from a real installed third-party distribution (``ejk-testplugin``).

Each check runs in a fresh interpreter with the distribution's install directory on
``PYTHONPATH``, so ``importlib.metadata`` finds it exactly as it would after ``pip install``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

RunPython = Callable[..., Any]  # the run_python fixture of conftest.py

TEST_PLUGINS = ("testplugin", "testbroken", "testbadhook", "testraises")
REAL_PLUGINS = ("cute", "pallas", "triton", "xla")

REPORT = """
import json, sys, warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import ejk
    imported_by_import_ejk = sorted(m for m in sys.modules if m.startswith("ejk_"))
    algorithms = ejk.kernel_registry.list_algorithms()
    host = ejk.get_plugin_host()
report = {
    "imported_by_import_ejk": imported_by_import_ejk,
    "algorithms": algorithms,
    "plugins": {
        name: {"status": i.status, "distribution": i.distribution, "version": i.version, "error": i.error,
               "fix": i.fix, "platforms": [[s.platform, s.available] for s in i.platforms]}
        for name, i in host.plugins.items()
    },
    "warnings": [[w.category.__name__, str(w.message)] for w in caught if "ejk plugin" in str(w.message)],
    "modules": sorted(m for m in sys.modules if m.startswith("ejk_")),
}
"""


def test_installed_distribution_is_discovered_and_broken_plugins_reported(testplugin_site: Path,
                                                                        run_python: RunPython) -> None:
    code = REPORT + """
import jax.numpy as jnp
spec = ejk.kernel_registry.get_spec("testplugin_scale", platform="auto")
report["spec"] = [spec.platform, str(spec.backend), spec.priority, spec.plugin.name, spec.plugin.distribution,
                  spec.plugin.version, spec.cfg_type.__name__]
report["result"] = ejk.kernel_registry.get("TestPlugin_Scale", platform="TestPlat")(jnp.ones(3)).tolist()
report["space"] = [c.factor for c in host.config_space("testplugin_scale", "testplat", None)]
report["heuristic"] = host.heuristic_config("testplugin_scale", "testplat", None).factor
report["fingerprint"] = ejk.device_fingerprint()
report["available"] = list(ejk.kernel_registry.platform_available("testplat"))
print(json.dumps(report))
"""
    report = run_python(code, testplugin_site, EJK_PLUGINS=",".join(TEST_PLUGINS))
    assert report["imported_by_import_ejk"] == []  # loading is lazy: the first query loads the plugins
    plugins = report["plugins"]
    assert set(plugins) == set(TEST_PLUGINS) | set(REAL_PLUGINS)
    for name in REAL_PLUGINS:
        assert plugins[name]["status"] == "disabled"
        assert plugins[name]["error"] == "not in EJK_PLUGINS"
    for name in TEST_PLUGINS:
        assert plugins[name]["distribution"] == "ejk-testplugin"
        assert plugins[name]["version"] == "0.3.1"

    good = plugins["testplugin"]
    assert good["status"] == "loaded" and good["error"] is None
    assert good["platforms"] == [["testplat", True]]
    assert report["algorithms"] == ["testplugin_scale"]  # nothing from the broken ones, partial or not
    assert report["spec"] == ["testplat", "any", 5, "testplugin", "ejk-testplugin", "0.3.1", "ScaleConfig"]
    assert report["result"] == [2.0, 2.0, 2.0]
    assert report["space"] == [1, 2, 3]
    assert report["heuristic"] == 3
    assert report["fingerprint"].endswith("|testplugin=seen")
    assert report["available"] == [True, None]

    broken = plugins["testbroken"]
    assert broken["status"] == "failed"
    assert "import of ejk_testplugin.broken failed" in broken["error"]
    assert "ejk_testplugin_missing_toolkit" in broken["error"]
    assert "reinstall ejk-testplugin" in broken["fix"] and "EJK_DISABLE_PLUGINS=testbroken" in broken["fix"]

    badhook = plugins["testbadhook"]
    assert badhook["status"] == "failed"
    assert "invalid hooks" in badhook["error"] and "registry_version" in badhook["error"]
    assert "ejk.hookspecs" in badhook["fix"]

    raises = plugins["testraises"]
    assert raises["status"] == "failed"
    assert "cannot initialise the device library" in raises["error"]
    assert "1 partial registration(s) rolled back" in raises["error"]
    assert "EJK_DISABLE_PLUGINS=testraises" in raises["fix"]

    warned = report["warnings"]
    assert [w[0] for w in warned] == ["RuntimeWarning"] * 3
    for name in ("testbroken", "testbadhook", "testraises"):
        assert sum(f"ejk plugin '{name}' (ejk-testplugin) was skipped" in w[1] for w in warned) == 1


def test_allow_list_loads_only_the_named_plugins(testplugin_site: Path, run_python: RunPython) -> None:
    report = run_python(REPORT + "print(json.dumps(report))", testplugin_site, EJK_PLUGINS="TestPlugin")
    statuses = {name: p["status"] for name, p in report["plugins"].items()}
    assert statuses == {"testplugin": "loaded", **{n: "disabled" for n in TEST_PLUGINS[1:] + REAL_PLUGINS}}
    assert report["warnings"] == []
    # Disabled plugins are never imported.
    assert report["modules"] == ["ejk_testplugin", "ejk_testplugin.plugin"]


def test_block_list_skips_the_named_plugins(testplugin_site: Path, run_python: RunPython) -> None:
    blocked = ("testbroken", "testbadhook", "testraises", "xla")  # xla: tested in test_integration.py
    report = run_python(REPORT + "print(json.dumps(report))", testplugin_site,
                        EJK_DISABLE_PLUGINS=",".join(blocked))
    plugins = report["plugins"]
    for name in blocked:
        assert plugins[name]["status"] == "disabled"
        assert plugins[name]["error"] == "disabled by EJK_DISABLE_PLUGINS"
    for name in ("testplugin", "pallas", "triton", "cute"):
        assert plugins[name]["status"] == "loaded", plugins[name]
    assert report["warnings"] == []
    assert "ejk_testplugin.broken" not in report["modules"]
    assert "ejk_xla" not in report["modules"]
    assert {"ejk_pallas.plugin", "ejk_triton.plugin", "ejk_cute.plugin"} <= set(report["modules"])


def test_not_found_error_names_skipped_plugins_and_what_to_install(testplugin_site: Path,
                                                                   run_python: RunPython) -> None:
    code = REPORT + """
try:
    ejk.kernel_registry.get("testplugin_scale", platform="triton", backend="gpu")
except ejk.KernelNotFoundError as exc:
    report["message"] = str(exc)
    report["is_value_error"] = isinstance(exc, ValueError)
print(json.dumps(report))
"""
    report = run_python(code, testplugin_site, EJK_PLUGINS="testplugin,testbroken",
                        PYTHONWARNINGS="ignore::RuntimeWarning")
    message = report["message"]
    assert report["is_value_error"] is True
    assert "testplat/any (priority 5, plugin testplugin (ejk-testplugin 0.3.1))" in message
    assert "Plugin testbroken (ejk-testplugin) was failed" in message
    assert "ejk_testplugin_missing_toolkit" in message
    assert "Plugin triton (ejk-triton) was disabled: not in EJK_PLUGINS" in message
    assert "pip install ejk-triton" in message


def test_the_test_distribution_is_not_installed_in_this_process() -> None:
    import importlib.metadata
    import importlib.util

    assert importlib.util.find_spec("ejk_testplugin") is None
    assert "testplugin" not in {ep.name for ep in importlib.metadata.entry_points(group="ejk")}
