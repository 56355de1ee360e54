"""``ejk new-plugin NAME``: write a plugin distribution from the template shipped with ejk-core.

The output (``<dir>/ejk-<name>``) is ready to install and test: a pyproject with the ``ejk`` entry
point and an ``ejk-core`` version range, a public op declared with ``ejk.ops.define_op``, one
implementation with its config class, config space, heuristic and capability gate, the
``ejk_platform_status`` hook, a reference, a conformance check and tests using ``ejk.testing``.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "core_range", "names", "write_plugin"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def names(name: str) -> dict[str, str]:
    """The template's substitutions for plugin ``name`` (``my_kernels``, ``ejk-my-kernels``, ...).

    Raises:
        ValueError: when ``name`` cannot be a Python identifier and an entry-point name.
    """
    raw = name.strip().lower().replace("-", "_")
    raw = raw[len("ejk_"):] if raw.startswith("ejk_") else raw
    if not _NAME.match(raw) or raw.endswith("_"):
        raise ValueError(f"plugin name {name!r} is not valid: use lower-case letters, digits and '_' (or '-'), "
                         "starting with a letter, e.g. 'mykernels'")
    from ejk import __version__

    return {
        "name": raw, "package": f"ejk_{raw}", "distribution": f"ejk-{raw.replace('_', '-')}", "op": f"{raw}_softcap",
        "core_version": __version__, "core_range": core_range(__version__),
    }


def core_range(version: str) -> str:
    """The ``ejk-core`` requirement for plugins written against ``version``: its minor series while
    ejk is 0.x (``>=0.1,<0.2``), its major series from 1.0 on (``>=1.2,<2``)."""
    parts = [int(p) for p in re.findall(r"\d+", version)[:2]] + [0, 0]
    major, minor = parts[0], parts[1]
    return f">={major}.{minor},<{major}.{minor + 1}" if major == 0 else f">={major}.{minor},<{major + 1}"


def _render(text: str, subs: dict[str, str]) -> str:
    return re.sub(r"\{\{(\w+)\}\}", lambda m: subs[m.group(1)], text)


def write_plugin(name: str, directory: str | Path = ".") -> Path:
    """Write the distribution of plugin ``name`` into ``directory``; returns its root.

    Raises:
        ValueError: for an invalid name.
        FileExistsError: when the target exists and is not empty.
    """
    subs = names(name)
    root = Path(directory) / subs["distribution"]
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} exists and is not empty; choose another --dir or remove it")
    template = resources.files("ejk").joinpath("templates", "plugin")
    written = []

    def walk(node: Any, parts: tuple[str, ...]) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir():
                walk(child, (*parts, child.name))
            elif child.name.endswith(".tmpl"):
                target_parts = [subs["package"] if p == "src" else p for p in parts]
                prefix = ["src"] if parts and parts[0] == "src" else []
                target = root.joinpath(*prefix, *target_parts, child.name[: -len(".tmpl")])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(_render(child.read_text(encoding="utf-8"), subs), encoding="utf-8")
                written.append(target)

    walk(template, ())
    if not written:
        raise FileNotFoundError(f"the plugin template of ejk-core is missing ({template}); reinstall ejk-core")
    return root


def add_parser(sub: Any) -> None:
    p = sub.add_parser("new-plugin", help="write a new plugin distribution from the template (ready to install)",
                       description="Writes <dir>/ejk-NAME: an installable plugin with a public op, one "
                                   "implementation, its config, config space, heuristic and gate, and tests.")
    p.add_argument("name", help="plugin (entry-point) name, e.g. mykernels")
    p.add_argument("--dir", default=".", help="parent directory of the new distribution (default: .)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        root = write_plugin(args.name, args.dir)
    except (ValueError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    subs = names(args.name)
    print(f"wrote {root}\n"
          f"  pip install {root}\n"
          f"  ejk kernels {subs['op']}\n"
          f"  pytest {root / 'tests'}")
    return 0
