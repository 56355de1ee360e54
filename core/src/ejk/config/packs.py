"""Config packs: tuned configs for named devices that plugins ship with their distribution.

A pack is a JSON file in the ``ejk cache export`` layout with ``"format": "ejk-config-pack"``;
plugins list theirs through the ``ejk_config_packs`` hook. The selection chain consults packs
after the user's persistent cache and before autotuning, so a user's own tuning always wins and
a device the pack covers needs no tuning. ``ejk cache export --pack`` writes one from a cache.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections.abc import Iterable
from typing import Any

from ejk.config._cache_import import ImportProblem, _entry
from ejk.config.persistent import CacheEntry
from ejk.config.serialization import from_jsonable

__all__ = ["PACK_FORMAT", "PackHit", "export_pack", "find_in_packs", "pack_config", "pack_paths", "pack_rows",
           "read_pack", "write_pack"]

PACK_FORMAT = "ejk-config-pack"
PackHit = tuple[CacheEntry, str]  # the entry and the pack file it came from

_lock = threading.Lock()
_loaded: dict[str, tuple[Any, dict[tuple[str, str, str], CacheEntry]]] = {}  # path -> (stat stamp, entries)


def read_pack(path: str) -> dict[tuple[str, str, str], CacheEntry]:
    """Entries of one pack by ``(device, op_id, call_key)``.

    Raises:
        ValueError: when the file is not a valid ``ejk-config-pack`` (naming the problem).
    """
    with open(path, encoding="utf-8") as f:
        payload = json.load(f)
    if not isinstance(payload, dict) or payload.get("format") != PACK_FORMAT:
        raise ValueError(f"{path} is not an {PACK_FORMAT} file (format {payload.get('format')!r})"
                         if isinstance(payload, dict) else f"{path} holds {type(payload).__name__}, not an object")
    ops = payload.get("ops")
    if not isinstance(ops, dict):
        raise ValueError(f"{path}: ops needs an object of op name -> entries")
    entries: dict[tuple[str, str, str], CacheEntry] = {}
    for name, items in ops.items():
        if not isinstance(items, list):
            raise ValueError(f"{path}: ops[{name!r}] needs a list of entries")
        for index, item in enumerate(items):
            try:
                entry = _entry(name, index, item)
            except ImportProblem as exc:
                raise ValueError(f"{path}: {exc}") from None
            entries[(entry.device, entry.op_id, entry.call_key)] = entry
    return entries


def write_pack(entries: Iterable[CacheEntry], path: str, *, name: str | None = None) -> int:
    """Write ``entries`` (e.g. a tuned persistent cache's) as a pack; returns how many."""
    ops: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        ops.setdefault(e.op_id.split("@")[0], []).append(
            {"device": e.device, "op_id": e.op_id, "call_key": e.call_key, **e.to_json(), "source": "pack"})
    payload = {"format": PACK_FORMAT, "schema": 1, "name": name or os.path.basename(path), "ops": ops}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
    return sum(len(v) for v in ops.values())


def pack_paths(host: Any) -> list[str]:
    """Every pack path the loaded plugins list (in the documented hook order, duplicates dropped).

    Goes through the host's ``call``: a plugin whose hook raises or returns something other than
    a list of paths is reported against it (``ejk plugins``) and its answer ignored.
    """
    if host is None:
        return []
    paths: list[str] = []
    for result in host.call("ejk_config_packs"):
        for path in result or ():
            text = os.fspath(path)
            if text not in paths:
                paths.append(text)
    return paths


def _entries(path: str) -> dict[tuple[str, str, str], CacheEntry]:
    try:
        stat = os.stat(path)
        stamp: Any = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        stamp = None
    with _lock:
        cached = _loaded.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
    try:
        entries = read_pack(path) if stamp is not None else {}
        if stamp is None:
            warnings.warn(f"config pack {path} does not exist; it is ignored", RuntimeWarning, stacklevel=4)
    except (OSError, ValueError) as exc:
        warnings.warn(f"config pack {path} is unreadable ({exc}); it is ignored", RuntimeWarning, stacklevel=4)
        entries = {}
    with _lock:
        _loaded[path] = (stamp, entries)
    return entries


def find_in_packs(host: Any, device: str, op_id: str, call_key: str) -> PackHit | None:
    """The first pack entry for this key, with its pack's path."""
    for path in pack_paths(host):
        entry = _entries(path).get((device, op_id, call_key))
        if entry is not None:
            return entry, path
    return None


def pack_config(host: Any, kernel: Any, key: tuple[str, str, str], skipped: list[str]) -> tuple[Any, str] | None:
    """``(config, "pack <path>")`` for an invocation's cache key, rebuilt by the kernel; a stale
    or unreadable entry is noted in ``skipped`` and ignored."""
    hit = find_in_packs(host, *key)
    if hit is None:
        return None
    entry, path = hit
    reason = entry.stale_reason()
    if reason is None:
        try:
            return from_jsonable(entry.cfg, kernel.cfg_from_json), f"pack {path}"
        except Exception as exc:
            reason = f"cannot be rebuilt: {type(exc).__name__}: {exc}"
    skipped.append(f"pack {path} entry not used: {reason}")
    return None


def pack_rows() -> list[dict[str, Any]]:
    """Rows of ``ejk cache show --packs``: every entry of every pack the loaded plugins list."""
    from ejk.plugins import get_plugin_host

    rows = []
    for path in pack_paths(get_plugin_host()):
        for e in _entries(path).values():
            rows.append({"file": path, "device": e.device, "op_id": e.op_id, "call_key": e.call_key, "cfg": e.cfg,
                         "source": f"pack {path}", "created": e.provenance.get("created"),
                         "stale": e.stale_reason(), "versions": e.provenance.get("versions", {})})
    return rows


def export_pack(cache_files: list[str], target: str, read: Any, say: Any) -> int:
    """``ejk cache export --pack``: current (non-stale) entries of ``cache_files`` into pack ``target``."""
    entries: list[CacheEntry] = []
    for path in cache_files:
        found, _ = read(path)
        entries.extend(e for e in found if e.stale_reason() is None)
    if target == "-":
        raise SystemExit("ejk cache export --pack needs a file name, not '-'")
    count = write_pack(entries, target)
    say(f"wrote a config pack of {count} entries to {target}")
    return 0
