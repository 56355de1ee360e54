"""Every distribution installed together: the four platform plugins plus a third-party one.

Runs in a fresh interpreter (the real entry points, the real global registry), with the
third-party test distribution ``ejk-testplugin`` on the path next to the workspace plugins.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from typing import Any

RunPython = Callable[..., Any]  # the run_python fixture of conftest.py

ALL = """
import json, sys, warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import jax, jax.numpy as jnp
    import ejk
    from ejk import kernel_registry as registry
    algorithms = registry.list_algorithms()
    host = ejk.get_plugin_host()
    statuses = {name: [s.available, s.reason] for name, s in host.platform_statuses().items()}
    specs = {algo: [[str(s.platform), str(s.backend), s.plugin.name, s.plugin.distribution, s.plugin.version]
                    for s in registry.list_implementations(algo)] for algo in algorithms}
    auto = {algo: str(registry.get_spec(algo, platform="auto").platform) for algo in algorithms}
    args = (jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((32, 16), jnp.float32))
    matmul_spec = registry.get_spec("matmul", platform="xla")
    space = matmul_spec.config_space(a=args[0], b=args[1])
    heuristic = matmul_spec.heuristic(a=args[0], b=args[1])
    validated = registry.validate_signatures()
print(json.dumps({
    "plugins": {n: [i.status, i.error, i.distribution] for n, i in host.plugins.items()},
    "hook_errors": {n: i.hook_errors for n, i in host.plugins.items() if i.hook_errors},
    "statuses": statuses,
    "specs": specs,
    "auto": auto,
    "space": len(space),
    "heuristic_type": type(heuristic).__name__ if heuristic is not None else None,
    "validated": validated,
    "warnings": [f"{w.category.__name__}: {w.message}" for w in caught if "ejk" in str(w.message)],
}))
"""


def test_everything_installed_together(testplugin_site: Path, run_python: RunPython) -> None:
    report = run_python(ALL, testplugin_site, EJK_DISABLE_PLUGINS="testbroken,testbadhook,testraises")
    assert report["warnings"] == []
    assert report["hook_errors"] == {}
    plugins = report["plugins"]
    for name, dist in (("xla", "ejk-xla"), ("pallas", "ejk-pallas"), ("triton", "ejk-triton"),
                       ("cute", "ejk-cute"), ("testplugin", "ejk-testplugin")):
        assert plugins[name][0] == "loaded", plugins[name]
        assert plugins[name][2] == dist

    statuses = report["statuses"]
    assert statuses["xla"] == [True, None]
    assert statuses["testplat"] == [True, None]
    for name in ("pallas", "triton", "cute"):
        assert statuses[name][0] is False and statuses[name][1]

    specs = report["specs"]
    xla_version = importlib.metadata.version("ejk-xla")
    for algo in ("flash_attention", "matmul", "grouped_matmul", "ragged_paged_attention"):
        assert ["xla", "any", "xla", "ejk-xla", xla_version] in specs[algo]
        assert report["auto"][algo] == "xla"  # the only available platform for these on a CPU
    assert specs["testplugin_scale"] == [["testplat", "any", "testplugin", "ejk-testplugin", "0.3.1"]]
    assert report["auto"]["testplugin_scale"] == "testplat"
    assert report["space"] >= 1
    assert report["heuristic_type"] == "MatmulConfig"
    assert report["validated"] is True  # every algorithm's implementations share one signature
