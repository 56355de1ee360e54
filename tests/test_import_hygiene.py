"""``import ejk`` is cheap and side-effect free: no plugin, no toolkit, no directory, no config change."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

RunPython = Callable[..., Any]  # the run_python fixture of conftest.py

CHECK = """
import json, os, sys
import jax

config_before = dict(jax.config.values)
environ_before = dict(os.environ)
modules_before = set(sys.modules)
import ejk
import ejk.config, ejk.execution, ejk.plugins, ejk.registry
chain = ejk.ConfigSelectorChain()
cache = ejk.PersistentCache("flash_attention")
path = cache.path
new = sorted(set(sys.modules) - modules_before)
print(json.dumps({
    "new_modules": new,
    "config_changed": sorted(k for k, v in jax.config.values.items() if config_before.get(k, object()) != v),
    "environ_changed": sorted(k for k in set(os.environ) | set(environ_before)
                              if os.environ.get(k) != environ_before.get(k)),
    "registry_loaded": ejk.kernel_registry._loaded,
    "host": ejk.plugins._host is not None,
    "cache_path": path,
}))
"""

FORBIDDEN = ("triton", "jax_triton", "cutlass", "torch", "ejk_xla", "ejk_pallas", "ejk_triton", "ejk_cute",
             "ejk_testplugin", "ejk.ops", "ejk.cli", "rich", "ejk.bench", "matplotlib")


def test_import_ejk_loads_no_plugin_and_no_toolkit(testplugin_site: Path, run_python: RunPython,
                                                   tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    cache_dir = tmp_path / "not-created" / "cache"
    report = run_python(CHECK, testplugin_site, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
                        EJK_CACHE_DIR=str(cache_dir))
    new = report["new_modules"]
    assert "ejk" in new
    offending = [m for m in new if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert offending == []
    assert report["registry_loaded"] is False and report["host"] is False
    assert report["config_changed"] == []
    assert report["environ_changed"] == []
    assert report["cache_path"] == str(cache_dir / "flash_attention.json")
    assert not (tmp_path / "not-created").exists()
    assert list(home.iterdir()) == []


def test_default_cache_dir_is_not_created_on_import(run_python: RunPython, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    code = CHECK.replace('cache = ejk.PersistentCache("flash_attention")',
                         'cache = ejk.PersistentCache("flash_attention"); cache.get("d", "o", "k")')
    report = run_python(code, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), EJK_CACHE_DIR="")
    assert report["cache_path"].startswith(str(home / ".cache"))
    assert list(home.iterdir()) == []


def test_public_ops_are_imported_on_first_access(run_python: RunPython) -> None:
    code = ("import json, sys\nimport ejk\nbefore = 'ejk.ops' in sys.modules\nfn = ejk.matmul\n"
            "print(json.dumps({'before': before, 'after': 'ejk.ops' in sys.modules, 'callable': callable(fn), "
            "'loaded': ejk.kernel_registry._loaded}))")
    assert run_python(code) == {"before": False, "after": True, "callable": True, "loaded": False}
