"""``ejk plugins`` and the plugin part of ``ejk doctor``: per plugin, its distribution and version,
the implementations it registered, and for each one whether it can run here and, if not, the fix."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.markup import escape
from rich.table import Table

from ejk._console import console as make_console

__all__ = ["cmd_plugins", "implementation_rows", "implementation_status", "plugin_rows", "problems"]


def implementation_status(host: Any, spec: Any) -> tuple[str | None, str | None]:
    """``(reason, fix)`` when implementation ``spec`` cannot run here, ``(None, None)`` when it can:
    the status its plugin (else any plugin) reported for its platform, then its backend against JAX's
    default one. The one answer of ``ejk plugins`` and ``ejk kernels``."""
    from ejk.registry import Backend, default_backend

    plugin = spec.plugin.name if spec.plugin else None
    status = (host.plugin_status(plugin, spec.platform) if plugin is not None else None) \
        or host.platform_statuses().get(str(spec.platform))
    if status is not None and not status.available:
        return f"platform {spec.platform}: {status.reason or 'unavailable'}", status.fix
    backend = default_backend()
    if spec.backend not in (Backend.ANY, backend):
        return (f"targets {spec.backend}, but JAX's default backend is {backend}",
                f"run on a machine with a {str(spec.backend).upper()}")
    return None, None


def implementation_rows(host: Any, plugin: str | None) -> list[dict[str, Any]]:
    """One row per implementation registered by ``plugin`` (``None``: registered outside any plugin):
    its label, priority, config class, ``backward`` (``None``: JAX differentiates the forward; ``own``;
    ``paired by residuals '<tag>'`` for a forward-only one), and ``status`` ``available`` or
    ``unavailable`` with ``reason`` and ``fix``."""
    rows = []
    for spec in host.registry:
        if (spec.plugin.name if spec.plugin else None) != plugin:
            continue
        reason, fix = implementation_status(host, spec)
        rows.append({
            "algorithm": spec.algorithm, "implementation": spec.label, "priority": spec.priority,
            "config": spec.cfg_type.__name__ if spec.cfg_type else None, "gated": spec.capability is not None,
            "backward": None if spec.vjp is None else spec.vjp.describe_backward(),
            "status": "available" if reason is None else "unavailable", "reason": reason, "fix": fix,
        })
    return rows


def plugin_rows(host: Any) -> list[dict[str, Any]]:
    """What ``ejk plugins --json`` prints: one object per plugin."""
    rows = []
    for info in sorted(host.plugins.values(), key=lambda i: i.name):
        rows.append({
            "name": info.name, "distribution": info.distribution, "version": info.version, "status": info.status,
            "platforms": [{"platform": p.platform, "available": p.available, "reason": p.reason, "fix": p.fix,
                           "versions": dict(p.versions)} for p in info.platforms],
            "implementations": implementation_rows(host, info.name) if info.status == "loaded" else [],
            "error": info.error, "fix": info.fix, "hook_errors": list(info.hook_errors),
        })
    return rows


def problems(host: Any) -> list[str]:
    """Problems of the plugins for ``ejk doctor``: failed plugins, hook errors, a loaded plugin that
    registered nothing. Unavailable implementations are listed by :func:`cmd_plugins`, not blamed."""
    found = []
    for info in host.plugins.values():
        if info.status == "failed":
            found.append(f"plugin {info.name}: {info.error} (fix: {info.fix})")
        found.extend(f"plugin {info.name}: {e}" for e in info.hook_errors)
        if info.status == "loaded" and not info.platforms:
            found.append(f"plugin {info.name} ({info.distribution or 'no distribution'}) reports no platform "
                         "status: implement the ejk_platform_status hook")
    return found


def print_plugin_table(host: Any, rows: list[dict[str, Any]] | None = None) -> None:
    """The table of ``ejk plugins`` (also shown by ``ejk doctor``)."""
    console = make_console()
    rows = plugin_rows(host) if rows is None else rows
    if not rows:
        from ejk.registry import PORTABLE_DISTRIBUTION

        console.print("No ejk plugin is installed. The portable default: "
                      f"[bold]pip install {PORTABLE_DISTRIBUTION}[/bold]")
        return
    table = Table(title="ejk plugins")
    for column in ("plugin", "distribution", "status", "implementation", "why / fix"):
        table.add_column(column)
    for row in rows:
        name = escape(row["name"])
        dist = escape(f"{row['distribution'] or '-'} {row['version'] or ''}".strip())
        if row["status"] != "loaded":
            table.add_row(name, dist, f"[red]{row['status']}[/red]", "-",
                          escape(f"{row['error']}\nfix: {row['fix']}"))
            continue
        for p in row["platforms"]:
            state = "[green]available[/green]" if p["available"] else "[yellow]unavailable[/yellow]"
            why = "" if p["available"] else f"{p['reason']}" + (f"\nfix: {p['fix']}" if p["fix"] else "")
            table.add_row(name, dist, state, escape(f"platform {p['platform']}"), escape(why))
        down = {f"platform {p['platform']}: {p['reason'] or 'unavailable'}" for p in row["platforms"]
                if not p["available"]}
        for impl in row["implementations"]:
            state = "[green]available[/green]" if impl["status"] == "available" else "[yellow]unavailable[/yellow]"
            why = impl["reason"] or ""
            if why in down:  # said (with the fix) on the platform's row above
                why = why.split(":")[0] + " is unavailable (above)"
            elif impl["fix"]:
                why += f"\nfix: {impl['fix']}"
            label = f"{impl['algorithm']} {impl['implementation']}"
            if impl["backward"] not in (None, "own"):  # a forward-only one: say whose backward runs
                label += f"\nbackward: {impl['backward']}"
            table.add_row(name, dist, state, escape(label), escape(why))
        if not row["platforms"] and not row["implementations"]:
            table.add_row(name, dist, "[green]loaded[/green]", "-", "registers nothing")
        for error in row["hook_errors"]:
            table.add_row(name, dist, "[red]hook error[/red]", "-", escape(error))
    console.print(table)


def cmd_plugins(args: argparse.Namespace, host: Any) -> int:
    rows = plugin_rows(host)
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True, default=str))
        return 0
    print_plugin_table(host, rows)
    return 0
