"""The import rules of the monorepo, checked by ``nox -s lint`` (``python tools/check_imports.py``).

1. **ejk-core is layered.** :data:`LAYERS` lists the modules of ``core/src/ejk`` from the bottom up;
   a module imports only modules of its own layer or of a lower one, and no two modules import each
   other, directly or through others (no cycle, within a layer too). Imports inside functions count;
   imports under ``if TYPE_CHECKING:`` do not (they never run). An import names the module it
   imports from: ``from ejk.ops import run`` is an import of ``ejk.ops``, ``from ejk.config import
   packs`` one of ``ejk.config.packs``; the parent packages Python runs first are not counted.
2. **Outside ejk-core, only public ejk modules.** Every other Python file of the repository (plugins,
   their tests, the example plugin, benchmarks, ``tests/``) and the ``ejk new-plugin`` templates
   import no private ``ejk`` module or name: no ``ejk._x``, ``ejk.a._b``, ``from ejk.a import _b``.

Exit status 1 with one line per violation (``path:line: what``), else 0.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "ejk"

#: The layers of ejk-core, bottom first: ``(name, modules)``. An entry names a module and its
#: submodules (``ejk.config``: the package and everything in it) except the root package ``ejk``,
#: which names only itself; a module belongs to the layer of its longest entry.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundations", ("ejk.errors", "ejk._versions", "ejk.environment", "ejk._console", "ejk._hooktrace",
                     "ejk.tolerances", "ejk.tiling", "ejk.devices", "ejk.interpreter", "ejk.config.validators",
                     "ejk.config.serialization", "ejk.parallel._vma", "ejk._epoch")),
    ("registry", ("ejk._kernel_spec", "ejk._contract", "ejk._pairing", "ejk.registry", "ejk.hookspecs",
                  "ejk._operand_vjp")),
    ("plugin host", ("ejk.plugins",)),
    ("execution", ("ejk.execution", "ejk.invocations")),
    ("config selection", ("ejk.config",)),
    ("operations", ("ejk.ops",)),
    ("scale-out", ("ejk.parallel",)),
    ("public API", ("ejk", "ejk.plugin")),
    # An op folder's conformance check is test code: it sits with the testing kit it uses (the op's
    # definition names it as "module:attribute", imported only when a check runs).
    ("testing and benchmarking", ("ejk.testing", "ejk.bench", "ejk.ops.*._conformance")),
    ("command line", ("ejk.cli", "ejk.__main__", "ejk._bench_cli", "ejk._demo", "ejk._explain_cli",
                      "ejk._new_plugin", "ejk._plugins_cli")),
)

#: What rule 2 reads, relative to the repository root: Python files and the plugin templates.
TEMPLATES = "core/src/ejk/templates"
_SKIPPED_DIRS = {"__pycache__", "build", "dist", "node_modules"}


def module_name(path: Path, source_root: Path) -> str:
    """The dotted name of the module at ``path`` under ``source_root`` (a package is its ``__init__``)."""
    parts = list(path.relative_to(source_root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int | None:
    """The index in ``layers`` of ``module``'s layer (its longest matching entry), ``None`` if unlisted.
    An entry with ``*`` is a pattern over whole module names (``ejk.ops.*._conformance``)."""
    best: tuple[int, int] | None = None
    for index, (_, entries) in enumerate(layers):
        for entry in entries:
            if "*" in entry:
                matches = fnmatch.fnmatchcase(module, entry)
            else:
                matches = module == entry or (entry != PACKAGE and module.startswith(entry + "."))
            if matches and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    return None if best is None else best[1]


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) block."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


def imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, str | None, int]]:
    """``(module, name or None, line)`` of every import in ``tree`` that runs, at any depth: ``from m
    import n`` gives ``(m, n)``, ``import m`` and ``importlib.import_module("m")`` give ``(m, None)``.
    Relative imports are resolved against ``module``."""
    skipped = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                yield base, alias.name, node.lineno
        elif (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.args[0].value, None, node.lineno


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_import(module: str, name: str | None) -> str | None:
    """The private part of an import of ``ejk`` (``ejk._versions``; ``ejk.a._b`` of ``from ejk.a import _b``),
    else ``None``."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    for index, part in enumerate(parts):
        if _is_private(part):
            return ".".join(parts[: index + 1])
    if name is not None and _is_private(name):
        return f"{module}.{name}"
    return None


class _Core:
    """The modules of ejk-core and the import graph between them."""

    def __init__(self, source_root: Path) -> None:
        self.root = source_root
        self.paths = {module_name(p, source_root): p for p in sorted((source_root / PACKAGE).rglob("*.py"))}
        self.edges: dict[str, dict[str, int]] = {m: {} for m in self.paths}  # target -> first line
        for module, path in self.paths.items():
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for target, name, line in imports(tree, module, path.name == "__init__.py"):
                resolved = self._resolve(target, name)
                if resolved is not None and resolved != module:
                    self.edges[module].setdefault(resolved, line)

    def _resolve(self, target: str, name: str | None) -> str | None:
        """The core module an import names: ``target.name`` when that is a module, else ``target``
        or its closest existing parent; ``None`` outside ejk."""
        if name is not None and f"{target}.{name}" in self.paths:
            return f"{target}.{name}"
        while target and target not in self.paths:
            target = target.rpartition(".")[0]
        return target or None

    def shown(self, module: str) -> Path:
        path = self.paths[module]
        return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path

    def where(self, module: str, target: str) -> str:
        return f"{self.shown(module)}:{self.edges[module][target]}"

    def cycles(self) -> list[list[str]]:
        """The strongly connected components of more than one module (Tarjan), each sorted."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[list[str]] = []

        def visit(start: str) -> None:  # iterative: no recursion limit on deep graphs
            work: list[tuple[str, Iterator[str]]] = [(start, iter(self.edges[start]))]
            index[start] = low[start] = len(index)
            stack.append(start)
            on_stack.add(start)
            while work:
                node, children = work[-1]
                child = next(children, None)
                if child is not None:
                    if child not in index:
                        index[child] = low[child] = len(index)
                        stack.append(child)
                        on_stack.add(child)
                        work.append((child, iter(self.edges[child])))
                    elif child in on_stack:
                        low[node] = min(low[node], index[child])
                    continue
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

        for module in self.edges:
            if module not in index:
                visit(module)
        return sorted(found)


def check_layers(source_root: Path, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    """Rule 1 over the package under ``source_root``: unlisted modules, upward imports and cycles."""
    core = _Core(source_root)
    problems: list[str] = []
    for module in core.paths:
        if layer_of(module, layers) is None:
            problems.append(f"{core.shown(module)}: module {module} is in no layer: add it to LAYERS in "
                            "tools/check_imports.py")
    for module, targets in core.edges.items():
        low = layer_of(module, layers)
        for target in targets:
            high = layer_of(target, layers)
            if low is not None and high is not None and high > low:
                problems.append(f"{core.where(module, target)}: {module} (layer {layers[low][0]!r}) imports "
                                f"{target} of the higher layer {layers[high][0]!r}: move the code it needs down, "
                                "or pass it in")
    for component in core.cycles():
        members = set(component)
        links = [f"{m} -> {t} ({core.where(m, t)})" for m in component for t in core.edges[m] if t in members]
        problems.append(f"import cycle among {', '.join(component)}: " + "; ".join(links))
    return problems


def _python_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if parts[0] != "core" and not any(part.startswith(".") or part in _SKIPPED_DIRS for part in parts[:-1]):
            yield path
    yield from sorted((root / TEMPLATES).rglob("*.py.tmpl"))


def _parse(path: Path) -> ast.AST:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".tmpl":  # ``{{package}}`` placeholders become identifiers
        text = re.sub(r"\{\{(\w+)\}\}", r"\1", text)
    return ast.parse(text, str(path))


def check_private_imports(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    """Rule 2 over ``files``: each import of a private ``ejk`` module or name."""
    problems: list[str] = []
    for path in files:
        shown = path.relative_to(root) if path.is_relative_to(root) else path
        for module, name, line in imports(_parse(path), "", False):
            private = private_import(module, name)
            if private is not None:
                problems.append(f"{shown}:{line}: imports the private {private}: use the public API "
                                "(ejk, ejk.plugin, ejk.ops, ejk.testing, ...) or make what it needs public")
    return problems


def main() -> int:
    problems = check_layers(ROOT / "core" / "src") + check_private_imports(_python_files(ROOT))
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} import rule violation(s); the rules: tools/check_imports.py", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
