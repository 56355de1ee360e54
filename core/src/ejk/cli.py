"""The ``ejk`` command line: plugins, kernels, cache, doctor, demo, explain and bench."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from ejk._console import console as _console

if TYPE_CHECKING:
    from ejk.registry import KernelRegistry, KernelSpec

__all__ = ["main"]


def _host() -> Any:
    from ejk.plugins import get_plugin_host

    with warnings.catch_warnings():  # problems are shown in the tables instead
        warnings.simplefilter("ignore")
        return get_plugin_host()


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


# -- plugins / kernels -----------------------------------------------------------------------------


def cmd_plugins(args: argparse.Namespace) -> int:
    from ejk import _plugins_cli

    return _plugins_cli.cmd_plugins(args, _host())


def _all_implementations(registry: KernelRegistry) -> list[tuple[KernelSpec, bool]]:
    """Every implementation, registered ones then those op variants derive: ``(spec, derived)``."""
    from ejk.ops import OPS

    found = [(spec, False) for spec in registry]
    for definition in OPS.values():
        if definition.variant_of is not None:
            kernel = type(definition.kernel)(registry)
            found += [(spec, True) for spec in kernel.implementations() if spec.algorithm == definition.name
                      and spec not in registry.list_implementations(definition.name)]
    return found


def cmd_kernels(args: argparse.Namespace) -> int:
    from ejk._plugins_cli import implementation_status

    host = _host()
    registry = host.registry
    found = _all_implementations(registry)
    rows = [{
        "algorithm": s.algorithm, "platform": str(s.platform), "backend": str(s.backend), "name": s.name,
        "implementation": s.label, "tier": str(s.tier), "priority": s.priority, "gated": s.capability is not None,
        "custom_vjp": s.vjp is not None, "backward": None if s.vjp is None else s.vjp.describe_backward(),
        "plugin": str(s.plugin) if s.plugin else "-", "config": s.cfg_type.__name__ if s.cfg_type else "-",
        "reason": (status := implementation_status(host, s))[0], "fix": status[1], "available": status[0] is None,
        "derived": derived,
    } for s, derived in found if args.algorithm is None or s.algorithm == args.algorithm.lower()]
    from ejk.ops import OPS

    implemented = {s.algorithm for s, _ in found}
    unimplemented = [name for name in sorted(OPS) if name not in implemented
                     and (args.algorithm is None or name == args.algorithm)]
    if args.json:
        _print_json(rows)
        return 0
    table = Table(title="ejk kernels")
    for column in ("algorithm", "platform", "backend", "implementation", "tier", "priority", "plugin", "config",
                   "available here"):
        table.add_column(column)
    for r in rows:
        name = f"{r['name']} (from {OPS[str(r['algorithm'])].variant_of})" if r["derived"] else r["name"]
        table.add_row(*(escape(str(v)) for v in (r["algorithm"], r["platform"], r["backend"], name, r["tier"],
                                                  r["priority"], r["plugin"], r["config"])),
                      "yes" if r["available"] else "no")
    for name in unimplemented:  # a defined operation nobody implements yet: say so rather than hide it
        table.add_row(name, "-", "-", "-", "-", "-", "-", "(no implementation registered)", "no")
    _console().print(table if rows or unimplemented else "No kernels are registered (see `ejk plugins`).")
    return 0


# -- cache ---------------------------------------------------------------------------------------


def _cache_dir(args: argparse.Namespace) -> str:
    from ejk import environment

    return os.path.expanduser(args.dir) if args.dir else environment.cache_dir()


def _cache_files(directory: str, ops: Sequence[str] | None = None) -> dict[str, str]:
    """``{op name: path}`` of the ``*.json`` files in ``directory`` (names decoded from file names)."""
    from ejk.config.persistent import op_id_of_file_name

    if not os.path.isdir(directory):
        return {}
    files = {}
    for file_name in sorted(os.listdir(directory)):
        path = os.path.join(directory, file_name)
        if not file_name.endswith(".json") or not os.path.isfile(path):
            continue
        name = op_id_of_file_name(file_name) or file_name[: -len(".json")]
        if not ops or name in ops:
            files[name] = path
    return files


def _read(path: str) -> tuple[list[Any], str | None]:
    """A cache file's entries and, for a file that is not (wholly) ours, a note; never writes."""
    from ejk.config.persistent import read_cache_file

    state = read_cache_file(path)
    return list(state.entries.values()), state.note


def _label(name: str) -> str:
    """A name PersistentCache accepts with an explicit path (it is only recorded in the file)."""
    return re.sub(r"[^A-Za-z0-9_.@+%-]", "_", name) or "cache"


def _note(note: str | None) -> None:
    if note:
        print(f"note: {note}", file=sys.stderr)


def cmd_cache_ls(args: argparse.Namespace) -> int:
    directory = _cache_dir(args)
    files = _cache_files(directory)
    listing: dict[str, dict[str, Any]] = {}
    for name, path in files.items():
        entries, note = _read(path)
        listing[name] = {"path": path, "entries": len(entries), **({"note": note} if note else {})}
        _note(note)
    if args.json:
        _print_json(listing)
        return 0
    console = _console()
    console.print(f"cache directory: {escape(directory)}")
    if not files:
        console.print("(no cache files)")
        return 0
    table = Table()
    for column in ("op", "entries", "file"):
        table.add_column(column)
    for name, item in listing.items():
        table.add_row(escape(name), str(item["entries"]) if "note" not in item else f"{item['entries']} (see note)",
                      escape(item["path"]))
    console.print(table)
    return 0


def cmd_cache_show(args: argparse.Namespace) -> int:
    files = _cache_files(_cache_dir(args), args.op or None)
    rows = []
    for name, path in files.items():
        entries, note = _read(path)
        _note(note)
        for e in entries:
            rows.append({"file": name, "device": e.device, "op_id": e.op_id, "call_key": e.call_key, "cfg": e.cfg,
                         "source": e.source, "created": e.provenance.get("created"),
                         "stale": e.stale_reason(), "versions": e.provenance.get("versions", {})})
    if args.packs:  # plugins' config packs, each entry named by its pack
        from ejk.config.packs import pack_rows

        rows.extend(pack_rows())
    if args.json:
        _print_json(rows)
        return 0
    table = Table(title=f"cached configs in {escape(_cache_dir(args))}")
    for column in ("op", "device", "call key", "config", "source", "created", "stale?"):
        table.add_column(column)
    for r in rows:
        table.add_row(*(escape(str(value)) for value in (
            r["op_id"], r["device"], r["call_key"][:12], json.dumps(r["cfg"], sort_keys=True), r["source"],
            r["created"], r["stale"] or "no")))
    _console().print(table if rows else "(no cached configs)")
    return 0


def cmd_cache_clear(args: argparse.Namespace) -> int:
    from ejk.config.persistent import PersistentCache, leftover_temp_files, read_cache_file

    directory = _cache_dir(args)
    files = _cache_files(directory, args.op or None)
    ours, unreadable = {}, []
    for name, path in files.items():
        state = read_cache_file(path)
        if state.kind == "ours":
            ours[name] = path
        elif state.kind == "unreadable":  # maybe ours: it must not pass as cleared
            unreadable.append(path)
            print(f"error: could not clear {path}: {state.note}", file=sys.stderr)
        else:  # only files carrying the ejk format marker are ever touched
            _note(f"{state.note or path}; not cleared")
    leftovers = leftover_temp_files(directory, args.op or None)
    if not ours and not leftovers:
        if not unreadable:
            _console().print("nothing to clear")
        return 1 if unreadable else 0
    if not args.yes and sys.stdin.isatty():
        what = [f"every entry of {', '.join(ours)}"] if ours else []
        what += [f"{len(leftovers)} temporary files left by killed writers"] if leftovers else []
        answer = input(f"remove {' and '.join(what)}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            return 1
    failed = _clear_leftovers(leftovers)
    for name, path in ours.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok = PersistentCache(_label(name), path).clear()
        if ok:
            _console().print(f"cleared {escape(path)}")
        else:
            failed += 1
            why = "; ".join(str(w.message) for w in caught) or "unknown reason"
            print(f"error: could not clear {path}: {why}", file=sys.stderr)
    return 1 if failed or unreadable else 0


def _clear_leftovers(paths: list[str]) -> int:
    """Delete killed writers' temporary files (those a live writer holds are kept); how many failed."""
    from ejk.config.persistent import remove_leftover_temp_file

    removed = failed = 0
    for path in paths:
        try:
            removed += remove_leftover_temp_file(path)
        except OSError as exc:
            failed += 1
            print(f"error: could not remove {path}: {exc}", file=sys.stderr)
    if removed:
        _console().print(f"removed {removed} temporary files left by killed writers")
    if len(paths) - removed - failed:
        _console().print(f"kept {len(paths) - removed - failed} temporary files whose writers are still running")
    return failed


EXPORT_FORMAT = "ejk-cache-export"


def cmd_cache_export(args: argparse.Namespace) -> int:
    files = _cache_files(_cache_dir(args), args.op or None)
    if args.pack:  # a config pack a plugin can ship (see the ejk_config_packs hook)
        from ejk.config.packs import export_pack

        return export_pack([path for _, path in files.items()], args.file, _read, _console().print)
    ops = {}
    for name, path in files.items():
        entries, note = _read(path)
        _note(note)
        if entries:
            ops[name] = [{"device": e.device, "op_id": e.op_id, "call_key": e.call_key, **e.to_json()}
                         for e in entries]
    payload = {"format": EXPORT_FORMAT, "schema": 1, "ops": ops}
    text = json.dumps(payload, indent=1, sort_keys=True)
    if args.file == "-":
        print(text)
    else:
        from ejk.config.cache_file import atomic_write_text

        atomic_write_text(args.file, text)  # a kill mid-write leaves the previous file, never a part
        count = sum(len(v) for v in ops.values())
        _console().print(f"exported {count} entries of {len(ops)} op(s) to {escape(args.file)}")
    return 0


def cmd_cache_import(args: argparse.Namespace) -> int:
    from ejk.config._cache_import import ImportProblem, import_entries, parse_export

    try:
        with open(args.file, encoding="utf-8") if args.file != "-" else sys.stdin as f:
            payload = json.load(f)
    except (OSError, ValueError, RecursionError) as exc:
        _console().print(f"[red]cannot read {escape(args.file)}: {type(exc).__name__}: {escape(str(exc))}[/red]")
        return 2
    if not isinstance(payload, dict) or payload.get("format") != EXPORT_FORMAT:
        _console().print(f"[red]{escape(args.file)} is not an `ejk cache export` file[/red]")
        return 2
    directory = _cache_dir(args)
    try:  # everything is validated before anything is written
        batches = parse_export(payload, directory)
    except ImportProblem as exc:
        _console().print(f"[red]{escape(args.file)} was not imported (nothing was written): {escape(str(exc))}[/red]")
        return 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written, failed = import_entries(batches)
    if failed:
        why = "; ".join(str(w.message) for w in caught)
        _console().print(f"[red]could not write {escape(', '.join(failed))}[/red]"
                         + (f": {escape(why)}" if why else ""))
        return 1
    _console().print(f"imported {written} entries into {escape(directory)} (merged with what was there)")
    return 0


# -- doctor --------------------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    import platform as py_platform
    import tempfile

    import jax

    from ejk import environment
    from ejk._versions import installed_version

    console = _console()
    host = _host()
    problems: list[str] = []
    console.print(f"python {py_platform.python_version()}  jax {installed_version('jax')}  "
                  f"jaxlib {installed_version('jaxlib')}  ejk-core {installed_version('ejk-core')}")
    console.print(f"default backend: {jax.default_backend()}  devices: {', '.join(str(d) for d in jax.devices())}")
    from ejk.execution.device import device_fingerprint

    with warnings.catch_warnings():  # a plugin's bad answer is listed below as a problem
        warnings.simplefilter("ignore")
        fingerprint = device_fingerprint()
    console.print(f"device fingerprint: {escape(fingerprint)}")
    from ejk import _plugins_cli
    from ejk.testing import _hook_probe

    _hook_probe.probe_hooks(host)  # before the table: it shows what the hooks answered wrongly
    _plugins_cli.print_plugin_table(host)
    problems.extend(_plugins_cli.problems(host))
    usable = [p for p, s in host.platform_statuses().items() if s.available]
    console.print(f"usable platforms here: {', '.join(sorted(usable)) or 'none'}")
    if not host.registry.list_algorithms():
        from ejk.registry import PORTABLE_DISTRIBUTION

        problems.append(f"no kernels are registered: pip install {PORTABLE_DISTRIBUTION}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        host.registry.validate_signatures()
    problems.extend(f"signature: {w.message}" for w in caught)
    directory = environment.cache_dir()
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            pass
        console.print(f"cache directory: {escape(directory)} (writable)")
    except OSError as exc:
        problems.append(f"cache directory {directory} is not writable ({exc}); set {environment.EJK_CACHE_DIR}")
    for problem in problems:
        console.print(f"[red]problem:[/red] {escape(problem)}")
    console.print("[green]all good[/green]" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


# -- entry point ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ejk", description="ejk: kernels for JAX, chosen and tuned automatically.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plugins", help="installed plugins, versions, and why a platform is unavailable")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("kernels", help="registered kernels: algorithm × platform × backend × priority × plugin")
    p.add_argument("algorithm", nargs="?")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_kernels)

    cache = sub.add_parser("cache", help="inspect and manage the persistent config cache")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    for name, func, helptext in (
        ("ls", cmd_cache_ls, "cache files and entry counts"),
        ("show", cmd_cache_show, "cached configs with provenance"),
        ("clear", cmd_cache_clear, "remove cached configs"),
        ("export", cmd_cache_export, "write cached configs to a file"),
        ("import", cmd_cache_import, "merge an exported file into the cache"),
    ):
        p = cache_sub.add_parser(name, help=helptext)
        p.add_argument("--dir", help="cache directory (default: EJK_CACHE_DIR or the user cache dir)")
        if name in ("export", "import"):
            p.add_argument("file", help="file to write/read ('-' for stdout/stdin)")
        if name in ("show", "clear", "export"):
            p.add_argument("--op", action="append", help="only this op (repeatable)")
        if name in ("ls", "show"):
            p.add_argument("--json", action="store_true")
        if name == "show":
            p.add_argument("--packs", action="store_true", help="also list the config packs plugins ship")
        if name == "export":
            p.add_argument("--pack", action="store_true", help="write a config pack (for a plugin to ship)")
        if name == "clear":
            p.add_argument("--yes", "-y", action="store_true", help="do not ask")
        p.set_defaults(func=func)

    p = sub.add_parser("doctor", help="check the installation, plugins, signatures and cache directory")
    p.set_defaults(func=cmd_doctor)

    from ejk import _bench_cli, _demo, _explain_cli, _new_plugin

    _demo.add_parser(sub)
    _explain_cli.add_parser(sub)
    _bench_cli.add_parser(sub)
    _new_plugin.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ejk`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()
        return status
    except BrokenPipeError:  # `ejk kernels --json | head`: the reader stopped early; no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's exit-time flush must not fail again
        return 1  # as rich's tables do (and Python's documented recipe)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
