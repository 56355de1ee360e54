"""Persistent config cache: one JSON file per operation, safe under concurrent processes.

Writes take an inter-process file lock, re-read the file, merge the new entry and replace
the file atomically, so several processes tuning at once lose nothing. Reading never moves
or writes anything. Only files carrying the format marker (``"format": "ejk-config-cache"``)
are ever rewritten: a JSON file that is not ours is skipped with a warning and left alone
(writes then stay in memory), and so is one that cannot be read (no permission, or nested too
deeply); a file that is not JSON at all is ignored when read and moved aside (``*.corrupt-…``,
kept for inspection) only by a write. An entry that does not load
(a broken field, an unreadable provenance) is stale, with a warning. An unwritable location
degrades to memory with a warning. File names come from the op id by a reversible,
directory-safe encoding (see :func:`cache_file_name`).
Every entry records a schema version and its provenance (versions of ejk, jax, jaxlib and
the kernel's plugin and toolkit); an entry whose schema or recorded versions no longer
match what is installed is *stale*: ignored, reported, and overwritten by the next tuning.
"""

from __future__ import annotations

import datetime
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Generic, TypeVar

import filelock

from ejk import environment
from ejk._epoch import bump
from ejk._versions import core_versions
from ejk.config._cache_names import cache_file_name, op_id_of_file_name
from ejk.config.cache_file import (
    FILE_FORMAT,
    SCHEMA_VERSION,
    CacheEntry,
    CacheFile,
    atomic_write_json,
    file_payload,
    move_aside,
    read_cache_file,
    stat_stamp,
    temp_file_target,
)
from ejk.config.serialization import from_jsonable, to_jsonable

__all__ = [
    "FILE_FORMAT",
    "SCHEMA_VERSION",
    "CacheEntry",
    "CacheFile",
    "PersistentCache",
    "StaleCacheWarning",
    "cache_file_name",
    "leftover_temp_files",
    "op_id_of_file_name",
    "read_cache_file",
    "remove_leftover_temp_file",
]

Cfg = TypeVar("Cfg")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.@+%-]+$")
LOCK_TIMEOUT_S = 60.0
#: A temporary file untouched this long is a killed writer's (a live one renames it within moments).
TEMP_FILE_GRACE_S = 60.0
#: How long :meth:`PersistentCache.recent_fingerprint` reuses a fingerprint (seconds).
RECHECK_S = 0.05
_writes = [0]  # cache files written by this process (any PersistentCache): each ends a reused fingerprint


class StaleCacheWarning(UserWarning):
    """A persisted config was recorded under other versions or schema and is ignored."""


class _NotOursError(Exception):
    """A file at the cache's path that is valid JSON but not an ejk config cache, or that cannot be read."""


class PersistentCache(Generic[Cfg]):
    """A JSON file of configs keyed by ``(device, op_id, call_key)``.

    Args:
        opname: Operation name (any op id); the file is ``<EJK_CACHE_DIR or user cache
            dir>/<cache_file_name(opname)>``, e.g. ``flash_attention.json`` or ``team%2Fx.json``.
            (An absolute path ending in ``.json`` is accepted here too, as in the earlier API.)
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
        if path is None and os.path.isabs(opname) and opname.endswith(".json"):  # the earlier API
            path, opname = opname, os.path.splitext(os.path.basename(opname))[0]
        if path is not None and not _SAFE_NAME.match(opname):
            raise ValueError(f"opname {opname!r} must use letters, digits and . _ @ + - % only")
        self._init(opname, path, loader, dumper, cfg_type)

    @classmethod
    def for_op(
        cls,
        op_id: str,
        path: str | os.PathLike[str] | None = None,
        loader: Callable[[Any], Cfg] | None = None,
        dumper: Callable[[Cfg], Any] | None = None,
    ) -> PersistentCache[Cfg]:
        """The cache of op ``op_id``, whose id is only ever a name: without ``path`` the file is
        ``cache_file_name(op_id)`` in the cache directory, even for an id that reads as a path."""
        cache: PersistentCache[Cfg] = cls.__new__(cls)
        cache._init(op_id, path, loader, dumper, None)
        return cache

    def _init(
        self,
        opname: str,
        path: str | os.PathLike[str] | None,
        loader: Callable[[Any], Cfg] | None,
        dumper: Callable[[Cfg], Any] | None,
        cfg_type: type[Cfg] | None,
    ) -> None:
        if path is None:
            self._file_name = cache_file_name(opname)  # any op id: encoded; raises if it cannot be
        self.opname = opname
        self._explicit_path = os.fspath(path) if path is not None else None
        self.loader, self.dumper, self.cfg_type = loader, dumper, cfg_type
        self._lock = threading.RLock()
        self._snapshot: dict[tuple[str, str, str], CacheEntry] = {}
        self._stamp: tuple[int, int] | None = None
        self._unsaved: dict[tuple[str, str, str], CacheEntry] = {}
        self._memory_only_reason: str | None = None
        self._reported: set[tuple[str, str, str]] = set()
        self._notes: set[str] = set()
        self._version = 0  # bumped whenever this object's own (unsaved) entries change
        self._path_memo: tuple[str, str] | None = None
        self._absent = False  # the file was absent at the last fingerprint
        self._fingerprint_memo: tuple[float, int, tuple[Any, ...]] | None = None  # (when, _writes, fingerprint)
        self.stale: list[tuple[CacheEntry, str]] = []

    @property
    def path(self) -> str:
        """The JSON file (resolved when first needed, so ``EJK_CACHE_DIR`` may change before)."""
        if self._explicit_path is not None:
            return self._explicit_path
        directory = environment.cache_dir()
        memo = self._path_memo
        if memo is not None and memo[0] is directory:  # the same resolution: the same file
            return memo[1]
        path = os.path.join(directory, self._file_name)
        self._path_memo = (directory, path)
        return path

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

    def fingerprint(self) -> tuple[Any, ...]:
        """What :meth:`get` answers depend on: the file's path, its ``(mtime, size)`` on disk
        (``None`` when absent) and this object's unsaved entries. While the fingerprint is
        unchanged every lookup answers as before (one ``stat``; nothing is read)."""
        path, writes, now = self.path, _writes[0], time.monotonic()
        found: tuple[Any, ...]
        if self._absent and not os.access(path, os.F_OK):  # still absent: cheaper than a failing stat
            found = (path, None, self._version)
        else:
            try:
                st = os.stat(path)
            except OSError:
                self._absent = True
                found = (path, None, self._version)
            else:
                self._absent = False
                found = (path, (st.st_mtime_ns, st.st_size), self._version)
        self._fingerprint_memo = (now, writes, found)
        return found

    def recent_fingerprint(self) -> tuple[Any, ...]:
        """:meth:`fingerprint`, or the one taken less than :data:`RECHECK_S` ago while neither this object
        nor any other cache file object of this process wrote since, nor the path changed: what a
        remembered decision checks on each eager call (a ``stat`` per call costs more than the rest of it).
        A file written by another process is seen within :data:`RECHECK_S`."""
        memo = self._fingerprint_memo
        if (memo is not None and time.monotonic() - memo[0] < RECHECK_S and memo[1] == _writes[0]
                and memo[2][2] == self._version and memo[2][0] == self.path):
            return memo[2]
        return self.fingerprint()

    def recheck_in(self) -> float:
        """Seconds until :meth:`recent_fingerprint` looks at the file again (``0``: at its next call)."""
        memo = self._fingerprint_memo
        return 0.0 if memo is None else max(0.0, memo[0] + RECHECK_S - time.monotonic())

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
        """Re-read the file when it changed on disk (cheap ``stat`` otherwise); never writes."""
        try:
            st = os.stat(self.path)
        except OSError:
            self._snapshot, self._stamp = {}, None
            return self._snapshot
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            state = read_cache_file(self.path)
            if state.note is not None:
                self._note(state.note)
            self._snapshot, self._stamp = dict(state.entries), stamp
        return self._snapshot

    def _note(self, note: str) -> None:
        """Warn once per distinct problem of the file."""
        with self._lock:
            if note in self._notes:
                return
            self._notes.add(note)
        warnings.warn(note, RuntimeWarning, stacklevel=5)

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
            self._version += 1
            self._flush()
        bump()

    def remove(self, device: str, op_id: str, call_key: str) -> bool:
        """Delete one entry; returns whether it existed."""
        with self._lock:
            existed = self._unsaved.pop((device, op_id, call_key), None) is not None
            self._version += 1
            return self._rewrite(lambda data: data.pop((device, op_id, call_key), None) is not None) or existed

    def clear(self) -> bool:
        """Delete every entry (the file is rewritten empty under the lock).

        Returns:
            ``True`` when the file now holds no entry (or does not exist); ``False`` when it
            could not be rewritten (a warning says why) or is not an ejk cache file.
        """
        with self._lock:
            self._unsaved.clear()
            self._version += 1
            return self._rewrite(_clear_all) or not os.path.exists(self.path)

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
                state = read_cache_file(path)
                if state.kind in ("foreign", "unreadable", "too_deep"):  # not ours, or maybe ours: never touched
                    raise _NotOursError(state.note or path)
                if state.kind == "corrupt":  # not JSON at all: kept for inspection, out of the way
                    move_aside(path, state.note or "")
                data = dict(state.entries)
                changed = change(data)
                if changed:
                    atomic_write_json(path, file_payload(self.opname, data))
                    _writes[0] += 1
                self._snapshot, self._stamp = data, stat_stamp(path)
                return bool(changed)
        except _NotOursError as exc:
            if self._memory_only_reason is None:
                self._memory_only_reason = str(exc)
                warnings.warn(f"{exc}; it is left alone and tuned configs are kept in memory for this process "
                              f"only. Move it away, or set {environment.EJK_CACHE_DIR} to another directory.",
                              RuntimeWarning, stacklevel=5)
            return False
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




def leftover_temp_files(directory: str, ops: Collection[str] | None = None) -> list[str]:
    """The temporary files that killed writers left in ``directory``: only ejk's own
    (``<cache file>.json.<8 hex digits>.tmp``), untouched for ``TEMP_FILE_GRACE_S``; with ``ops``,
    only those of these ops' cache files."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in names:
        target = temp_file_target(name)
        if target is None or not target.endswith(".json"):
            continue
        if ops and (op_id_of_file_name(target) or target[: -len(".json")]) not in ops:
            continue
        path = os.path.join(directory, name)
        try:
            if time.time() - os.stat(path).st_mtime < TEMP_FILE_GRACE_S:
                continue
        except OSError:
            continue
        found.append(path)
    return found


def remove_leftover_temp_file(path: str) -> bool:
    """Delete a file of :func:`leftover_temp_files` while holding its cache file's lock, so that a
    writer stopped mid-write keeps its file. Returns ``False`` when such a writer holds the lock.

    Raises:
        OSError: when the file exists and cannot be deleted.
    """
    directory, name = os.path.split(path)
    target = temp_file_target(name)
    if target is None:
        raise ValueError(f"{path} is not a temporary file of an ejk cache")
    try:
        with filelock.FileLock(os.path.join(directory, target + ".lock"), timeout=0):
            os.unlink(path)
    except filelock.Timeout:
        return False
    except FileNotFoundError:  # another clear got there first
        pass
    return True
