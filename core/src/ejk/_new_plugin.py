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

__all__ = ["MAX_NAME_LENGTH", "OWN_NAMES", "add_parser", "core_range", "names", "write_plugin"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
#: The longest plugin name whose generated code keeps to the template's 120-column lines.
MAX_NAME_LENGTH = 20
#: Names of ejk's own distributions (``ejk-<name>``): a plugin of that name would install over one of them.
OWN_NAMES = ("core", "xla", "pallas", "triton", "cute")


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
    if len(raw) > MAX_NAME_LENGTH:
        shown = repr(name) if len(name) <= 40 else f"{name[:40]!r}..."
        raise ValueError(f"plugin name {shown} is too long ({len(raw)} characters, at most "
                         f"{MAX_NAME_LENGTH}); choose a shorter NAME")
    if raw in OWN_NAMES:
        raise ValueError(f"plugin name {name!r} would write ejk-{raw}, the name of ejk's own distribution: "
                         f"installing it would replace the real one; choose another NAME, e.g. 'my_{raw}'")
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
        ValueError: for an invalid name, too long or one of :data:`OWN_NAMES`.
        FileExistsError: when the target exists and is not an empty directory, or ``directory`` is a file.
        OSError: when the distribution cannot be written there.
    """
    subs = names(name)
    root = Path(directory) / subs["distribution"]
    try:
        _check_target(Path(directory), root)
    except FileExistsError:
        raise
    except OSError as exc:  # e.g. a path too long for the file system
        raise OSError(f"cannot write {root} ({exc.strerror or exc}); choose another --dir") from exc
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

    try:
        walk(template, ())
    except OSError as exc:
        raise OSError(f"cannot write {root} ({exc.strerror or exc}: {exc.filename}); "
                      "choose a --dir you can write to") from exc
    if not written:
        raise FileNotFoundError(f"the plugin template of ejk-core is missing ({template}); reinstall ejk-core")
    return root


def _check_target(directory: Path, root: Path) -> None:
    """Refuse a ``directory`` that is a file, and a ``root`` that is a file or a non-empty directory."""
    if directory.exists() and not directory.is_dir():
        raise FileExistsError(f"--dir {directory} is not a directory; choose a directory (it is created if missing)")
    if root.exists() and not root.is_dir():
        raise FileExistsError(f"{root} is a file, in the way of the new distribution; move it, or choose another "
                              "--dir or NAME")
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} exists and is not empty; choose another --dir or remove it")


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
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    subs = names(args.name)
    print(f"wrote {root}\n"
          f"  pip install {root}\n"
          f"  ejk kernels {subs['op']}\n"
          f"  pytest {root / 'tests'}")
    return 0
