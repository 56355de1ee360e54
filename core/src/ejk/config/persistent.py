"""Persistent config cache: one JSON file per operation, safe under concurrent processes.

Writes take an inter-process file lock, re-read the file, merge the new entry and replace
the file atomically, so several processes tuning at once lose nothing. A corrupt file is
moved aside with a warning; an unwritable location degrades to memory with a warning.
Every entry records a schema version and its provenance (versions of ejk, jax, jaxlib and
the kernel's plugin and toolkit); an entry whose schema or recorded versions no longer
match what is installed is *stale*: ignored, reported, and overwritten by the next tuning.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import attrs
import filelock

from ejk import environment
from ejk._versions import core_versions, installed_version

__all__ = ["SCHEMA_VERSION", "CacheEntry", "PersistentCache", "StaleCacheWarning"]

Cfg = TypeVar("Cfg")
SCHEMA_VERSION = 1
FILE_FORMAT = "ejk-config-cache"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.@+-]+$")
LOCK_TIMEOUT_S = 60.0


class StaleCacheWarning(UserWarning):
    """A persisted config was recorded under other versions or schema and is ignored."""


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

    def to_json(self) -> dict[str, Any]:
        return {"cfg": self.cfg, "schema": self.schema, "source": self.source, "provenance": dict(self.provenance)}

    def stale_reason(self) -> str | None:
        """Why this entry must not be reused here, or ``None`` when it is current."""
        if self.schema != SCHEMA_VERSION:
            return f"schema {self.schema} (this ejk writes schema {SCHEMA_VERSION})"
        recorded = self.provenance.get("versions", {})
        if not isinstance(recorded, Mapping):
            return "provenance without versions"
        changed = [
            f"{name} {version} -> {installed_version(name) or 'not installed'}"
            for name, version in sorted(recorded.items())
            if installed_version(name) != version
        ]
        return "recorded under other versions: " + ", ".join(changed) if changed else None


def to_jsonable(cfg: Any, dumper: Callable[[Any], Any] | None = None) -> Any:
    """Serialise a config: ``dumper``, attrs class, dataclass, pydantic v2 model, or raw JSON.

    Raises:
        TypeError: when the result is not JSON-serialisable (pass a ``dumper``).
    """
    if dumper is not None:
        data = dumper(cfg)
    elif attrs.has(type(cfg)):
        data = attrs.asdict(cfg, recurse=True)
    elif dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        data = dataclasses.asdict(cfg)
    elif hasattr(cfg, "model_dump") and callable(cfg.model_dump):
        data = cfg.model_dump(mode="json")
    else:
        data = cfg
    try:
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"config {cfg!r} of type {type(cfg).__name__} is not JSON-serialisable ({exc}); "
            "use an attrs class, a dataclass or a pydantic model, or pass dumper=/loader="
        ) from None
    return data


def from_jsonable(data: Any, loader: Callable[[Any], Any] | None = None, cfg_type: type | None = None) -> Any:
    """Rebuild a config with ``loader`` or ``cfg_type`` (attrs / dataclass / pydantic); else raw."""
    if loader is not None:
        return loader(data)
    if cfg_type is None:
        return data
    if hasattr(cfg_type, "model_validate"):
        return cfg_type.model_validate(data)
    if isinstance(data, Mapping) and (attrs.has(cfg_type) or dataclasses.is_dataclass(cfg_type)):
        return cfg_type(**{key: _as_tuples(value) for key, value in data.items()})
    return cfg_type(data)


def _as_tuples(value: Any) -> Any:
    """JSON has no tuples: arrays come back as tuples, as immutable (hashable) configs hold them."""
    if isinstance(value, list):
        return tuple(_as_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _as_tuples(v) for k, v in value.items()}
    return value


class PersistentCache(Generic[Cfg]):
    """A JSON file of configs keyed by ``(device, op_id, call_key)``.

    Args:
        opname: Operation name; the file is ``<EJK_CACHE_DIR or user cache dir>/<opname>.json``.
            (A path ending in ``.json`` is accepted here too, as in the earlier API.)
        path: Explicit file path, overriding the directory rule.
        loader: Rebuilds a config from its JSON value.
        dumper: Turns a config into a JSON value.
        cfg_type: Config class to rebuild (attrs, dataclass or pydantic v2) when no loader.
    """

    def __init__(
        self,
        opname: str,
        path: str | os.PathLike[str] | None = None,
        loader: Callable[[Any], Cfg] | None = None,
        dumper: Callable[[Cfg], Any] | None = None,
        cfg_type: type[Cfg] | None = None,
    ) -> None:
        if path is None and (opname.endswith(".json") or os.sep in opname):
            path, opname = opname, os.path.splitext(os.path.basename(opname))[0]
        if not _SAFE_NAME.match(opname):
            raise ValueError(f"opname {opname!r} must use letters, digits and . _ @ + - only")
        self.opname = opname
        self._explicit_path = os.fspath(path) if path is not None else None
        self.loader, self.dumper, self.cfg_type = loader, dumper, cfg_type
        self._lock = threading.RLock()
        self._snapshot: dict[tuple[str, str, str], CacheEntry] = {}
        self._stamp: tuple[int, int] | None = None
        self._unsaved: dict[tuple[str, str, str], CacheEntry] = {}
        self._memory_only_reason: str | None = None
        self._reported: set[tuple[str, str, str]] = set()
        self.stale: list[tuple[CacheEntry, str]] = []

    @property
    def path(self) -> str:
        """The JSON file (resolved when first needed, so ``EJK_CACHE_DIR`` may change before)."""
        if self._explicit_path is not None:
            return self._explicit_path
        return os.path.join(environment.cache_dir(), f"{self.opname}.json")

    @property
    def memory_only(self) -> bool:
        """``True`` once a write failed and new entries live in memory only."""
        return self._memory_only_reason is not None

    # -- reading -----------------------------------------------------------------------------

    def get(self, device: str, op_id: str, call_key: str) -> Cfg | None:
        """The stored config, rebuilt with loader / cfg_type; ``None`` if absent or stale."""
        entry = self.get_entry(device, op_id, call_key)
        if entry is None:
            return None
        try:
            return from_jsonable(entry.cfg, self.loader, self.cfg_type)  # type: ignore[no-any-return]
        except Exception as exc:
            self._report_stale(entry, f"cannot be rebuilt: {type(exc).__name__}: {exc}")
            return None

    def get_entry(self, device: str, op_id: str, call_key: str) -> CacheEntry | None:
        """The raw current entry with its provenance; ``None`` if absent or stale."""
        key = (device, op_id, call_key)
        with self._lock:
            entry = self._unsaved.get(key) or self._refresh().get(key)
        if entry is None:
            return None
        reason = entry.stale_reason()
        if reason is not None:
            self._report_stale(entry, reason)
            return None
        return entry

    def entries(self) -> Iterator[CacheEntry]:
        """Every stored entry, stale ones included (for listing and export)."""
        with self._lock:
            merged = {**self._refresh(), **self._unsaved}
        yield from merged.values()

    def _report_stale(self, entry: CacheEntry, reason: str) -> None:
        key = (entry.device, entry.op_id, entry.call_key)
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
            self.stale.append((entry, reason))
        warnings.warn(
            f"ignoring stale cached config for {entry.op_id} on {entry.device} in {self.path}: {reason}. "
            "It will be re-tuned; `ejk cache clear` removes old entries.",
            StaleCacheWarning,
            stacklevel=4,
        )

    def _refresh(self) -> dict[tuple[str, str, str], CacheEntry]:
        """Re-read the file when it changed on disk (cheap ``stat`` otherwise)."""
        try:
            st = os.stat(self.path)
        except OSError:
            self._snapshot, self._stamp = {}, None
            return self._snapshot
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            data = self._read_file(move_corrupt=False)
            if data is None:  # corrupt: move it aside under the lock, so no writer's file is lost
                data = self._recover_corrupt()
            self._snapshot, self._stamp = data, stamp
        return self._snapshot

    def _recover_corrupt(self) -> dict[tuple[str, str, str], CacheEntry]:
        try:
            with filelock.FileLock(self.path + ".lock", timeout=LOCK_TIMEOUT_S):
                return self._read_file(move_corrupt=True) or {}
        except (OSError, filelock.Timeout) as exc:
            warnings.warn(f"config cache {self.path} is corrupt and cannot be locked ({exc}); it is ignored",
                          RuntimeWarning, stacklevel=5)
            return {}

    def _read_file(self, *, move_corrupt: bool) -> dict[tuple[str, str, str], CacheEntry] | None:
        """The file's entries; for a corrupt file ``None``, or ``{}`` after moving it aside."""
        try:
            with open(self.path, encoding="utf-8") as f:
                raw = json.load(f)
            return _parse(raw)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            if not move_corrupt:
                return None
            self._move_aside(exc)
            return {}

    def _move_aside(self, exc: Exception) -> None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
        target = f"{self.path}.corrupt-{stamp}-{os.getpid()}"
        try:
            os.replace(self.path, target)
            where = f"moved to {target}"
        except OSError as move_exc:
            where = f"could not be moved aside ({move_exc}); it is ignored"
        warnings.warn(f"config cache {self.path} is corrupt ({type(exc).__name__}: {exc}); {where}",
                      RuntimeWarning, stacklevel=5)

    # -- writing -----------------------------------------------------------------------------

    def put(
        self,
        device: str,
        op_id: str,
        call_key: str,
        cfg: Cfg,
        *,
        source: str = "autotune",
        versions: Mapping[str, str] | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """Store ``cfg`` atomically, merging with what other processes wrote meanwhile.

        Args:
            source: How the config was found (``autotune``, ``import`` …).
            versions: Distribution versions the config depends on, beyond ejk-core, jax and
                jaxlib (e.g. the plugin and its toolkit); a change makes the entry stale.
            details: Extra provenance (timings, candidates tried …).
        """
        entry = CacheEntry(
            device=device, op_id=op_id, call_key=call_key, cfg=to_jsonable(cfg, self.dumper), source=source,
            provenance={
                "versions": {**core_versions(), **dict(versions or {})},
                "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                **dict(details or {}),
            },
        )
        self.put_entries([entry])

    def put_entries(self, entries: list[CacheEntry]) -> None:
        """Merge several entries into the file in one locked read-merge-write."""
        with self._lock:
            for entry in entries:
                self._unsaved[(entry.device, entry.op_id, entry.call_key)] = entry
            self._flush()

    def remove(self, device: str, op_id: str, call_key: str) -> bool:
        """Delete one entry; returns whether it existed."""
        with self._lock:
            existed = self._unsaved.pop((device, op_id, call_key), None) is not None
            return self._rewrite(lambda data: data.pop((device, op_id, call_key), None) is not None) or existed

    def clear(self) -> None:
        """Delete every entry (the file is rewritten empty under the lock)."""
        with self._lock:
            self._unsaved.clear()
            self._rewrite(_clear_all)

    def _flush(self) -> None:
        if not self._unsaved:
            return
        pending = dict(self._unsaved)

        def merge(data: dict[tuple[str, str, str], CacheEntry]) -> bool:
            data.update(pending)
            return True

        if self._rewrite(merge):
            for key in pending:
                self._unsaved.pop(key, None)

    def _rewrite(self, change: Callable[[dict[tuple[str, str, str], CacheEntry]], bool]) -> bool:
        """Locked read-modify-write of the file; ``False`` (and memory-only mode) on failure."""
        path = self.path
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with filelock.FileLock(path + ".lock", timeout=LOCK_TIMEOUT_S):
                data = self._read_file(move_corrupt=True) or {}
                changed = change(data)
                if changed:
                    _atomic_write_json(path, _serialise(self.opname, data))
                self._snapshot, self._stamp = data, _stat_stamp(path)
                return bool(changed)
        except (OSError, filelock.Timeout) as exc:
            if self._memory_only_reason is None:
                self._memory_only_reason = str(exc)
                warnings.warn(
                    f"cannot write config cache {path} ({type(exc).__name__}: {exc}); tuned configs are kept "
                    f"in memory for this process only. Set {environment.EJK_CACHE_DIR} to a writable directory.",
                    RuntimeWarning,
                    stacklevel=5,
                )
            return False


def _clear_all(data: dict[tuple[str, str, str], CacheEntry]) -> bool:
    data.clear()
    return True


def _stat_stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _parse(raw: Any) -> dict[tuple[str, str, str], CacheEntry]:
    if not isinstance(raw, dict) or raw.get("format") != FILE_FORMAT:
        raise ValueError(f"not an {FILE_FORMAT} file")
    result = {}
    for device, ops in raw["entries"].items():
        for op_id, calls in ops.items():
            for call_key, item in calls.items():
                result[(device, op_id, call_key)] = CacheEntry(
                    device=device, op_id=op_id, call_key=call_key, cfg=item["cfg"],
                    schema=int(item.get("schema", 0)), source=str(item.get("source", "unknown")),
                    provenance=dict(item.get("provenance", {})),
                )
    return result


def _serialise(opname: str, data: Mapping[tuple[str, str, str], CacheEntry]) -> dict[str, Any]:
    nested: dict[str, dict[str, dict[str, Any]]] = {}
    for (device, op_id, call_key), entry in sorted(data.items()):
        nested.setdefault(device, {}).setdefault(op_id, {})[call_key] = entry.to_json()
    return {"format": FILE_FORMAT, "schema": SCHEMA_VERSION, "opname": opname, "entries": nested}


def _atomic_write_json(path: str, payload: Any) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
