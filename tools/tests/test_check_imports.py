"""Tests of tools/check_imports.py: the core's layers and cycles, and private imports from outside it."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest


def _load() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "check_imports.py"
    spec = importlib.util.spec_from_file_location("check_imports", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ci = _load()

LAYERS = (
    ("low", ("ejk.base", "ejk.util._helpers")),
    ("middle", ("ejk.util",)),
    ("top", ("ejk", "ejk.cli")),
)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def package(tmp_path: Path) -> dict[str, str]:
    return {
        "ejk/__init__.py": "from ejk.util import thing\n",
        "ejk/base.py": "import os\n",
        "ejk/util/__init__.py": "from ejk.util.core import thing\n",
        "ejk/util/core.py": "from ejk.base import os\nthing = 1\n",
        "ejk/util/_helpers.py": "",
        "ejk/cli.py": "import ejk\nfrom ejk import util\n",
    }


def test_a_layered_package_passes(tmp_path: Path, package: dict[str, str]) -> None:
    assert ci.check_layers(_tree(tmp_path, package), LAYERS) == []


def test_a_function_level_import_upward_is_reported(tmp_path: Path, package: dict[str, str]) -> None:
    package["ejk/base.py"] = "def f():\n    from ejk.util import core\n    return core\n"
    package["ejk/util/core.py"] = "thing = 1\n"
    (problem,) = ci.check_layers(_tree(tmp_path, package), LAYERS)
    assert "ejk.base (layer 'low') imports ejk.util.core of the higher layer 'middle'" in problem
    assert problem.split(": ")[0].endswith("ejk/base.py:2")


def test_a_cycle_within_a_layer_is_reported(tmp_path: Path, package: dict[str, str]) -> None:
    package["ejk/util/other.py"] = "def f():\n    import ejk.util.core\n"
    package["ejk/util/core.py"] = "from ejk.util import other\nthing = 1\n"
    (problem,) = ci.check_layers(_tree(tmp_path, package), LAYERS)
    assert problem.startswith("import cycle among ejk.util.core, ejk.util.other:")
    assert "ejk.util.core -> ejk.util.other" in problem and "ejk.util.other -> ejk.util.core" in problem


def test_a_cycle_through_the_package_init_is_reported(tmp_path: Path, package: dict[str, str]) -> None:
    package["ejk/util/core.py"] = "import importlib\ndef f():\n    return importlib.import_module('ejk.util')\n"
    (problem,) = ci.check_layers(_tree(tmp_path, package), LAYERS)
    assert problem.startswith("import cycle among ejk.util, ejk.util.core:")


def test_type_checking_imports_are_not_counted(tmp_path: Path, package: dict[str, str]) -> None:
    package["ejk/base.py"] = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from ejk.util.core import thing\n")
    assert ci.check_layers(_tree(tmp_path, package), LAYERS) == []


def test_relative_imports_are_resolved(tmp_path: Path, package: dict[str, str]) -> None:
    package["ejk/util/_helpers.py"] = "from . import core\n"
    (problem,) = ci.check_layers(_tree(tmp_path, package), LAYERS)
    assert "ejk.util._helpers (layer 'low') imports ejk.util.core" in problem


def test_a_module_in_no_layer_is_reported(tmp_path: Path, package: dict[str, str]) -> None:
    package["ejk/stray.py"] = ""
    (problem,) = ci.check_layers(_tree(tmp_path, package), LAYERS)
    assert "module ejk.stray is in no layer" in problem


def test_layer_of_takes_the_longest_entry_and_the_root_only_as_itself() -> None:
    assert ci.layer_of("ejk.util._helpers", LAYERS) == 0
    assert ci.layer_of("ejk.util.core", LAYERS) == 1
    assert ci.layer_of("ejk", LAYERS) == 2
    assert ci.layer_of("ejk.elsewhere", LAYERS) is None


def test_a_pattern_entry_places_matching_modules_above_their_package() -> None:
    layers = (("ops", ("ejk.ops",)), ("testing", ("ejk.testing", "ejk.ops.*._conformance")))
    assert ci.layer_of("ejk.ops._matmul._conformance", layers) == 1
    assert ci.layer_of("ejk.ops._matmul._op", layers) == 0
    assert ci.layer_of("ejk.ops._conformance_helpers", layers) == 0


@pytest.mark.parametrize(("source", "private"), [
    ("import ejk._versions", "ejk._versions"),
    ("import ejk.ops._base as base", "ejk.ops._base"),
    ("from ejk.ops._attention import KERNEL", "ejk.ops._attention"),
    ("from ejk.config import _device_clock", "ejk.config._device_clock"),
    ("from ejk import _versions", "ejk._versions"),
    ("from ejk.registry import _current_plugin", "ejk.registry._current_plugin"),
    ("def f():\n    from ejk._versions import installed_version", "ejk._versions"),
    ("importlib.import_module('ejk.parallel._ring')", "ejk.parallel._ring"),
])
def test_private_imports_are_reported(tmp_path: Path, source: str, private: str) -> None:
    path = _tree(tmp_path, {"plugin.py": source + "\n"}) / "plugin.py"
    (problem,) = ci.check_private_imports([path], tmp_path)
    assert problem.startswith("plugin.py:") and f"imports the private {private}:" in problem


@pytest.mark.parametrize("source", [
    "import ejk", "import ejk.ops", "from ejk import __version__", "from ejk.plugin import hookimpl",
    "from ejk.tiling import cdiv as _cdiv", "from ejk_triton import _device", "import ejk.__main__",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ejk.ops._base import OpKernel",
])
def test_public_imports_pass(tmp_path: Path, source: str) -> None:
    path = _tree(tmp_path, {"plugin.py": source + "\n"}) / "plugin.py"
    assert ci.check_private_imports([path], tmp_path) == []


def test_templates_are_read_with_their_placeholders(tmp_path: Path) -> None:
    path = _tree(tmp_path, {"plugin.py.tmpl": "from {{package}} import _kernel\nfrom ejk.ops import _base\n"})
    (problem,) = ci.check_private_imports([path / "plugin.py.tmpl"], tmp_path)
    assert "plugin.py.tmpl:2: imports the private ejk.ops._base" in problem


def test_the_files_read_outside_the_core_include_templates_not_the_core(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "core/src/ejk/x.py": "", "core/src/ejk/templates/plugin/src/plugin.py.tmpl": "",
        "plugins/p/src/p/a.py": "", "benchmarks/b.py": "", ".venv/lib/c.py": "", "tests/t.py": "",
    })
    found = sorted(str(p.relative_to(root)) for p in ci._python_files(root))
    assert found == ["benchmarks/b.py", "core/src/ejk/templates/plugin/src/plugin.py.tmpl", "plugins/p/src/p/a.py",
                     "tests/t.py"]


def test_the_core_of_this_repository_is_layered() -> None:
    assert ci.check_layers(ci.ROOT / "core" / "src") == []
