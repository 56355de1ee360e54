"""Config packs: tuned configs and measured rankings for named devices, shipped as data.

A pack is a JSON file in the ``ejk cache export`` layout with ``"format": "ejk-config-pack"``:
``ops`` holds tuned configs by device fingerprint, ``rankings`` measured orders of implementations
by device and shape class (:mod:`ejk.config.rankings`). Plugins list theirs through the
``ejk_config_packs`` hook; ejk-core ships the cross-plugin rankings (:data:`CORE_PACKS_DIR`),
consulted after every plugin's. The selection chain consults tuned configs after the user's
persistent cache and before autotuning, so a user's own tuning always wins and a device the pack
covers needs no tuning; the heuristics tier consults rankings before tiers and priorities.
``ejk cache export --pack`` writes a pack of configs from a cache.

A pack that cannot be read (missing, not JSON, nested too deeply, a path the OS refuses) or whose
content is malformed is reported — a ``RuntimeWarning`` and, for a plugin's pack, an error against
that plugin and hook (``ejk plugins``) — and ignored; a malformed ranking is ignored alone.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from ejk.config._cache_import import ImportProblem, _entry
from ejk.config.cache_file import atomic_write_json
from ejk.config.persistent import CacheEntry
from ejk.config.rankings import Ranking, RankingError, parse_rankings
from ejk.config.serialization import from_jsonable

__all__ = ["CORE_PACKS_DIR", "PACK_FORMAT", "Pack", "PackHit", "export_pack", "find_in_packs", "load_pack",
           "pack_config", "pack_paths", "pack_rankings", "pack_rows", "pack_sources", "read_pack", "write_pack"]

PACK_FORMAT = "ejk-config-pack"
PackHit = tuple[CacheEntry, str]  # the entry and the pack file it came from
#: ejk-core's own packs (``*.json``): rankings that name implementations of several plugins.
CORE_PACKS_DIR = Path(__file__).with_name("shipped_packs")
#: Who lists a pack: a plugin's name, or ``None`` for ejk-core's own.
Owner = str | None

_lock = threading.Lock()
_loaded: dict[str, tuple[Any, Pack]] = {}  # path -> (stat stamp, pack)
_warned: set[tuple[str, str]] = set()  # (path, problem) found while matching, warned once


@attrs.frozen(kw_only=True)
class Pack:
    """One pack file's content.

    Attributes:
        path: The file.
        entries: Tuned configs by ``(device, op_id, call_key)``.
        rankings: Measured orders by op name.
        problems: What was left out and why (the whole file, or single rankings).
    """

    path: str
    entries: Mapping[tuple[str, str, str], CacheEntry] = attrs.field(factory=dict)
    rankings: Mapping[str, tuple[Ranking, ...]] = attrs.field(factory=dict)
    problems: tuple[str, ...] = ()


def _payload(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        try:
            payload = json.load(f)
        except RecursionError:
            raise ValueError("its JSON is nested too deeply") from None
    if not isinstance(payload, dict) or payload.get("format") != PACK_FORMAT:
        raise ValueError(f"{path} is not an {PACK_FORMAT} file (format {payload.get('format')!r})"
                         if isinstance(payload, dict) else f"{path} holds {type(payload).__name__}, not an object")
    return payload


def _entries(path: str, ops: Any) -> dict[tuple[str, str, str], CacheEntry]:
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


def load_pack(path: str) -> Pack:
    """Read one pack: its configs, its rankings and the problems of rankings that were left out.

    Raises:
        OSError: when the file cannot be read.
        ValueError: when it is not a valid ``ejk-config-pack`` (naming the problem).
    """
    payload = _payload(path)
    if "ops" not in payload and "rankings" not in payload:
        raise ValueError(f"{path}: a pack needs ops (tuned configs) or rankings (measured orders)")
    entries = _entries(path, payload.get("ops", {}))
    rankings, problems = parse_rankings(payload.get("rankings", {}), path)
    return Pack(path=path, entries=entries, rankings=rankings, problems=tuple(problems))


def read_pack(path: str) -> dict[tuple[str, str, str], CacheEntry]:
    """Entries of one pack by ``(device, op_id, call_key)``.

    Raises:
        ValueError: when the file is not a valid ``ejk-config-pack`` (naming the problem).
    """
    return dict(load_pack(path).entries)


def write_pack(entries: Iterable[CacheEntry], path: str, *, name: str | None = None) -> int:
    """Write ``entries`` (e.g. a tuned persistent cache's) as a pack; returns how many."""
    ops: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        ops.setdefault(e.op_id.split("@")[0], []).append(
            {"device": e.device, "op_id": e.op_id, "call_key": e.call_key, **e.to_json(), "source": "pack"})
    payload = {"format": PACK_FORMAT, "schema": 1, "name": name or os.path.basename(path), "ops": ops}
    atomic_write_json(path, payload)
    return sum(len(v) for v in ops.values())


def _core_packs() -> list[str]:
    return sorted(str(p) for p in CORE_PACKS_DIR.glob("*.json"))


def pack_sources(host: Any) -> list[tuple[Owner, str]]:
    """``(owner, path)`` of every pack: the loaded plugins' (in the documented hook order), then
    ejk-core's own; duplicates dropped.

    Goes through the host: a plugin whose hook raises or returns something other than a list of
    paths is reported against it (``ejk plugins``) and its answer ignored; so is a path that is
    not a path.
    """
    sources: list[tuple[Owner, str]] = []
    seen: set[str] = set()
    listed = host._named_results("ejk_config_packs") if host is not None else []
    for owner, result in [*listed, *((None, [path]) for path in _core_packs())]:
        for path in result or ():
            try:
                text = os.fspath(path)
            except Exception as exc:
                _report(host, owner, f"pack path {path!r} is not a path ({type(exc).__name__}: {exc}); ignored")
                continue
            if text not in seen:
                seen.add(text)
                sources.append((owner, text))
    return sources


def pack_paths(host: Any) -> list[str]:
    """Every pack path (see :func:`pack_sources`)."""
    return [path for _, path in pack_sources(host)]


def _report(host: Any, owner: Owner, problem: str) -> None:
    """Record ``problem`` against plugin ``owner`` (once) for ``ejk plugins`` / ``ejk doctor``."""
    info = host.plugins.get(owner) if host is not None and owner is not None else None
    message = f"ejk_config_packs: {problem}"
    if info is not None and message not in info.hook_errors:
        info.hook_errors.append(message)


def _warn(path: str, owner: Owner, problem: str) -> None:
    who = f"plugin {owner}" if owner is not None else "ejk-core"
    warnings.warn(f"config pack {path} (from {who}) {problem}", RuntimeWarning, stacklevel=5)


def _pack(host: Any, owner: Owner, path: str) -> Pack:
    """The pack at ``path`` (re-read when the file changed); its problems reported against ``owner``."""
    try:
        stat = os.stat(path)
        stamp: Any = (stat.st_mtime_ns, stat.st_size)
    except (OSError, ValueError) as exc:  # ValueError: a path the OS refuses (an embedded NUL byte)
        stamp = ("missing", str(exc))
    with _lock:
        cached = _loaded.get(path)
    if cached is None or cached[0] != stamp:
        if stamp[0] == "missing":
            pack = Pack(path=path, problems=(f"does not exist or cannot be opened ({stamp[1]}); it is ignored",))
        else:
            try:
                pack = load_pack(path)
            except Exception as exc:  # nothing in a shipped data file may take an op down
                pack = Pack(path=path, problems=(f"is unreadable ({exc}); it is ignored",))
        for problem in pack.problems:
            _warn(path, owner, problem)
        with _lock:
            _loaded[path] = (stamp, pack)
        cached = (stamp, pack)
    for problem in cached[1].problems:
        _report(host, owner, f"pack {path} {problem}")
    return cached[1]


def find_in_packs(host: Any, device: str, op_id: str, call_key: str) -> PackHit | None:
    """The first pack entry for this key, with its pack's path."""
    for owner, path in pack_sources(host):
        entry = _pack(host, owner, path).entries.get((device, op_id, call_key))
        if entry is not None:
            return entry, path
    return None


def pack_rankings(host: Any, op: str, device: str, call: Mapping[str, Any], mode: str = "fwd") -> list[Ranking]:
    """Every ranking of ``mode`` (``"fwd"`` or ``"fwd+bwd"``, see :class:`Ranking`) that applies to ``call``
    of ``op`` on ``device``, in pack order (earlier decides first). A ranking whose shape class names an
    argument the op does not have is reported and skipped."""
    found = []
    for owner, path in pack_sources(host):
        for ranking in _pack(host, owner, path).rankings.get(op, ()):
            if not ranking.orders(mode):
                continue
            try:
                applies = ranking.applies(device, call)
            except RankingError as exc:
                problem = f"rankings[{op!r}][{ranking.index}] is ignored: {exc}"
                _report(host, owner, f"pack {path} {problem}")
                with _lock:
                    first = (path, problem) not in _warned
                    _warned.add((path, problem))
                if first:
                    _warn(path, owner, problem)
                continue
            if applies:
                found.append(ranking)
    return found


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
    host = get_plugin_host()
    for owner, path in pack_sources(host):
        for e in _pack(host, owner, path).entries.values():
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
