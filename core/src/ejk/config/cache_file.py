"""The on-disk format of a persistent config cache: entries with their provenance, reading a file
without changing anything, and writing one atomically (through a ``<file>.<8 hex digits>.tmp``
beside it, renamed over it once on disk: a killed writer leaves at most such a temporary file).

A file is ``{"format": "ejk-config-cache", "schema": 1, "opname": ..., "entries":
{device: {op_id: {call_key: {"cfg", "schema", "source", "provenance"}}}}}``. Locking and merging
concurrent writers is :class:`ejk.config.persistent.PersistentCache`'s job.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import stat
import warnings
from collections.abc import Mapping
from typing import Any

import attrs

from ejk._versions import installed_version

__all__ = [
    "FILE_FORMAT",
    "SCHEMA_VERSION",
    "CacheEntry",
    "CacheFile",
    "atomic_write_json",
    "atomic_write_text",
    "file_payload",
    "move_aside",
    "read_cache_file",
    "stat_stamp",
    "temp_file_target",
]

SCHEMA_VERSION = 1
FILE_FORMAT = "ejk-config-cache"
_TEMP_NAME = re.compile(r"^(?P<target>.+)\.[0-9a-f]{8}\.tmp$")


@attrs.frozen(kw_only=True)
class CacheEntry:
    """One persisted config with its provenance (as stored in the JSON file)."""

    device: str
    op_id: str
    call_key: str
    cfg: Any = attrs.field(eq=False)
    schema: int = SCHEMA_VERSION
    source: str = "autotune"
    provenance: Mapping[str, Any] = attrs.field(factory=dict, eq=False)
    problem: str | None = attrs.field(default=None, eq=False)  # why the stored entry does not load

    def to_json(self) -> dict[str, Any]:
        return {"cfg": self.cfg, "schema": self.schema, "source": self.source, "provenance": dict(self.provenance)}

    def stale_reason(self) -> str | None:
        """Why this entry must not be reused here, or ``None`` when it is current."""
        if self.problem is not None:
            return self.problem
        if self.schema != SCHEMA_VERSION:
            return f"schema {self.schema} (this ejk writes schema {SCHEMA_VERSION})"
        recorded = self.provenance.get("versions", {})
        if not isinstance(recorded, Mapping):
            return "provenance without versions"
        try:
            changed = [
                f"{name} {version} -> {installed_version(name) or 'not installed'}"
                for name, version in sorted(recorded.items())
                if installed_version(name) != version
            ]
        except Exception as exc:  # e.g. a version recorded under an empty or non-string name
            return f"its recorded versions cannot be checked ({type(exc).__name__}: {exc})"
        return "recorded under other versions: " + ", ".join(changed) if changed else None


def stat_stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


@attrs.frozen(kw_only=True)
class CacheFile:
    """What :func:`read_cache_file` found (reading never moves or writes anything).

    Attributes:
        kind: ``"missing"``, ``"ours"`` (carries the format marker), ``"foreign"`` (valid
            JSON without the marker: never touched), ``"unreadable"`` (no permission) or
            ``"too_deep"`` (nested too deeply to parse here), never touched either, or
            ``"corrupt"`` (not JSON).
        entries: The entries of an ejk cache file (broken ones included, as stale entries).
        note: What is wrong with the file, for a warning or the CLI.
    """

    kind: str
    entries: Mapping[tuple[str, str, str], CacheEntry] = attrs.field(factory=dict)
    note: str | None = None


def read_cache_file(path: str) -> CacheFile:
    """Read a cache file without changing anything on disk; never raises for bad content."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        return CacheFile(kind="missing")
    except OSError as exc:  # e.g. another user's file without read permission: never ours to move
        return CacheFile(kind="unreadable", note=f"config cache {path} cannot be read ({exc}); it is ignored")
    except RecursionError:  # a hand-edited entry nested deeper than this stack allows: the rest may be fine
        return CacheFile(kind="too_deep", note=f"config cache {path} cannot be read (nested too deeply); "
                                                 "it is ignored")
    except ValueError as exc:  # not JSON, or not UTF-8
        return CacheFile(kind="corrupt", note=f"config cache {path} is corrupt ({type(exc).__name__}: {exc}); "
                                              "it is ignored")
    if not isinstance(raw, dict) or raw.get("format") != FILE_FORMAT:
        return CacheFile(kind="foreign", note=f"{path} is not an ejk config cache (no \"format\": "
                                              f"\"{FILE_FORMAT}\" marker); skipped")
    entries, problems = _parse_entries(raw.get("entries"))
    note = None
    if problems:
        shown = "; ".join(problems[:3]) + (f" and {len(problems) - 3} more" if len(problems) > 3 else "")
        note = f"config cache {path} has parts that do not load ({shown}); they are ignored"
    return CacheFile(kind="ours", entries=entries, note=note)


def _parse_entries(raw: Any) -> tuple[dict[tuple[str, str, str], CacheEntry], list[str]]:
    """Entries of the ``entries`` mapping; an entry that does not load is kept as stale."""
    result: dict[tuple[str, str, str], CacheEntry] = {}
    problems: list[str] = []
    if not isinstance(raw, dict):
        return result, [f"entries is {type(raw).__name__}, not an object"]
    for device, ops in raw.items():
        if not isinstance(ops, dict):
            problems.append(f"entries[{device!r}] is {type(ops).__name__}, not an object")
            continue
        for op_id, calls in ops.items():
            if not isinstance(calls, dict):
                problems.append(f"entries[{device!r}][{op_id!r}] is {type(calls).__name__}, not an object")
                continue
            for call_key, item in calls.items():
                result[(device, op_id, call_key)] = _parse_entry(device, op_id, call_key, item)
    return result, problems


def _parse_entry(device: str, op_id: str, call_key: str, item: Any) -> CacheEntry:
    try:
        if not isinstance(item, dict) or "cfg" not in item:
            raise ValueError("an entry needs an object with a cfg")
        provenance = item.get("provenance", {})
        if not isinstance(provenance, dict):
            raise ValueError(f"provenance is {type(provenance).__name__}, not an object")
        schema = item.get("schema", 0)
        if not isinstance(schema, int) or isinstance(schema, bool):
            raise ValueError(f"schema is {schema!r}, not an int")
        return CacheEntry(device=device, op_id=op_id, call_key=call_key, cfg=item["cfg"], schema=schema,
                          source=str(item.get("source", "unknown")), provenance=provenance)
    except Exception as exc:
        return CacheEntry(device=device, op_id=op_id, call_key=call_key,
                          cfg=item.get("cfg") if isinstance(item, dict) else None, source="unknown",
                          problem=f"the stored entry does not load ({exc})")


def move_aside(path: str, note: str) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    target = f"{path}.corrupt-{stamp}-{os.getpid()}"
    try:
        os.replace(path, target)
        where = f"moved to {target}"
    except OSError as move_exc:
        where = f"could not be moved aside ({move_exc})"
    warnings.warn(f"{note.removesuffix('; it is ignored')}; {where}", RuntimeWarning, stacklevel=6)


def file_payload(opname: str, data: Mapping[tuple[str, str, str], CacheEntry]) -> dict[str, Any]:
    nested: dict[str, dict[str, dict[str, Any]]] = {}
    for (device, op_id, call_key), entry in sorted(data.items()):
        nested.setdefault(device, {}).setdefault(op_id, {})[call_key] = entry.to_json()
    return {"format": FILE_FORMAT, "schema": SCHEMA_VERSION, "opname": opname, "entries": nested}


def temp_file_target(name: str) -> str | None:
    """The name of the file that temporary file ``name`` was written to replace, or ``None`` when
    ``name`` is not one of :func:`atomic_write_text`'s temporary files."""
    match = _TEMP_NAME.match(name)
    return match.group("target") if match else None


def _temp_file(path: str) -> tuple[int, str]:
    """A new ``<path>.<random>.tmp`` opened for writing, with the permissions a new file gets here
    (``0o666`` less the umask: readable by the others of a shared directory when the umask says so)."""
    while True:
        tmp = f"{path}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def atomic_write_text(path: str, text: str) -> None:
    """Replace ``path`` by ``text`` atomically: a reader, or a kill at any moment, sees the old file
    or the whole new one, never a part. A rewrite keeps the file's permissions."""
    try:
        mode: int | None = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = None
    fd, tmp = _temp_file(os.path.abspath(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_json(path: str, payload: Any) -> None:
    """Write ``payload`` as indented JSON to ``path`` with :func:`atomic_write_text`."""
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True))
