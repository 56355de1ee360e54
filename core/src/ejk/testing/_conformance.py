"""Conformance checks a plugin's own test-suite runs against itself."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterable

from ejk.plugins import ENTRY_POINT_GROUP, PluginHost, PluginInfo
from ejk.registry import KernelRegistry

__all__ = ["ConformanceError", "check_discovered_plugins", "check_imports_lazily", "check_plugin", "expected_plugins"]

#: Toolkits a plugin module must not import at load time (so it loads and reports without them).
HEAVY_TOOLKITS = ("triton", "jax_triton", "cutlass", "torch")


class ConformanceError(AssertionError):
    """A plugin does not meet what ejk expects of it (raised even under ``python -O``)."""


def _require(condition: object, message: str) -> None:
    if not condition:
        raise ConformanceError(message)


def expected_plugins() -> set[str] | None:
    """The plugin names the test session says are installed (``EJK_EXPECT_PLUGINS``), if set."""
    raw = os.environ.get("EJK_EXPECT_PLUGINS")
    if raw is None:
        return set() if os.environ.get("EJK_EXPECT_NO_PLUGINS") == "1" else None
    return {name.strip() for name in raw.split(",") if name.strip()}


def check_plugin(name: str) -> tuple[PluginInfo, KernelRegistry]:
    """Load the installed plugin ``name`` into a fresh registry and check it behaves.

    Checks: its entry point exists in group ``ejk`` and loads, also among every installed plugin
    (none of its registrations may take a label another plugin registered first, or have a
    signature its op's call contract refuses), its hooks validate, it reports a status for at least one
    platform, and every kernel it registered names it as owner. Then its hooks are asked as ``ejk
    doctor`` asks them (``ejk_device_fingerprint`` for this machine's device, ``ejk_config_packs``,
    and ``ejk_choose_config`` and ``ejk_config_space`` on each sample call of each defined op it
    implements), and each of its implementations runs its gate, heuristic, config space and abstract
    output on those calls (see :func:`ejk.testing._hook_probe.implementation_problems`): none may
    raise or return a result of the wrong type, or one whose ``repr`` / ``str`` raises.

    Returns:
        The plugin's report and the registry it filled.
    """
    installed = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    eps = [ep for ep in installed if ep.name == name]
    _require(eps, f"no entry point {name!r} in group {ENTRY_POINT_GROUP!r}: is the distribution installed?")
    _check_among_others(name, installed)
    registry = KernelRegistry()
    host = PluginHost(registry, load_entry_points=False)
    host.load_entry_points(eps)
    info = host.plugins[name]
    _require(info.status == "loaded", f"plugin {name} did not load: {info.error} (fix: {info.fix})")
    _require(not info.hook_errors, f"plugin {name} hooks failed: {info.hook_errors}")
    _require(info.platforms, f"plugin {name} reports no platform status (implement ejk_platform_status)")
    for status in info.platforms:
        _require(status.available or status.reason, f"{name}: unavailable platform {status.platform} gives no reason")
    for spec in registry:
        _require(spec.plugin is not None and spec.plugin.name == name, f"{spec} is not attributed to {name}")
    import jax

    from ejk.testing import _hook_probe

    with warnings.catch_warnings():  # what a hook got wrong lands in info.hook_errors
        warnings.simplefilter("ignore")
        host.device_facts(jax.devices()[0])
    _hook_probe.probe_hooks(host, plugin=name)
    _require(not info.hook_errors, f"plugin {name} hooks failed: {info.hook_errors}")
    return info, registry


def _check_among_others(name: str, installed: Iterable[importlib.metadata.EntryPoint]) -> None:
    """Load every installed plugin, in the order ejk loads them: none of plugin ``name``'s
    registrations may be refused (a label another plugin registered first, a signature its op's
    contract refuses)."""
    host = PluginHost(KernelRegistry(), load_entry_points=False)
    with warnings.catch_warnings():  # the other plugins' problems are theirs; this one's land in hook_errors
        warnings.simplefilter("ignore")
        host.load_entry_points(installed)
    refused = [e for e in host.plugins[name].hook_errors if e.startswith("ejk_register_kernels:")]
    _require(not refused, f"plugin {name} registrations were refused: {refused}")


def check_discovered_plugins() -> bool:
    """Assert the installed ``ejk`` entry points are exactly those the session expects.

    Returns:
        ``False`` (nothing checked) when no expectation is set (``EJK_EXPECT_PLUGINS`` /
        ``EJK_EXPECT_NO_PLUGINS``, set by the nox sessions).
    """
    expected = expected_plugins()
    if expected is None:
        return False
    found = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    _require(found == expected, f"ejk entry points: {sorted(found)}; expected {sorted(expected)}")
    return True


def check_imports_lazily(module: str, toolkits: Iterable[str] = HEAVY_TOOLKITS) -> None:
    """Assert that importing ``module`` in a fresh interpreter imports none of ``toolkits``."""
    names = sorted(toolkits)
    code = (
        f"import sys, json, {module}; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {names!r})))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    _require(result.returncode == 0, f"import {module} failed:\n{result.stderr}")
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    _require(not loaded,
             f"import {module} imported {loaded}: import toolkits lazily, inside the functions that need them")
