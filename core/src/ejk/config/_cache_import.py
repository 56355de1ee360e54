"""``ejk cache import``: validate a whole export file first, then write (all or nothing).

Every op name, entry and target file is checked before the first write, so a file with one
bad entry, an op name that cannot be a file name, or a target that is not an ejk cache file
changes nothing on disk.
"""

from __future__ import annotations

import os
from typing import Any

from ejk.config._cache_names import cache_file_name
from ejk.config.persistent import CacheEntry, PersistentCache, read_cache_file

__all__ = ["ImportBatch", "ImportProblem", "import_entries", "parse_export"]

ImportBatch = tuple[str, str, list[CacheEntry]]  # (path, op name, entries)

#: The deepest nesting of JSON objects and lists an entry's cfg or provenance may have. A config is
#: a few levels deep; a deeper value could not be read back where the stack is already deep.
MAX_NESTING = 32


class ImportProblem(ValueError):  # noqa: N818 - it reads as "the import's problem"
    """The export file cannot be imported; the message says where and why."""


def _too_deep(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether ``value`` nests JSON objects and lists more than ``limit`` levels (without recursing)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _entry(name: str, index: int, item: Any) -> CacheEntry:
    where = f"ops[{name!r}][{index}]"
    if not isinstance(item, dict):
        raise ImportProblem(f"{where} is {type(item).__name__}, but needs an object")
    for key in ("device", "op_id", "call_key"):
        if not isinstance(item.get(key), str) or not item[key]:
            raise ImportProblem(f"{where}.{key} is {item.get(key)!r}, but needs a non-empty string")
    if "cfg" not in item:
        raise ImportProblem(f"{where} has no cfg")
    for key in ("cfg", "provenance"):
        if _too_deep(item.get(key)):
            raise ImportProblem(f"{where}.{key} is nested more than {MAX_NESTING} levels deep; a config is "
                                "a few levels deep: remove the entry or fix its value")
    schema = item.get("schema", 0)
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise ImportProblem(f"{where}.schema is {schema!r}, but needs an int")
    source = item.get("source", "import")
    if not isinstance(source, str):
        raise ImportProblem(f"{where}.source is {source!r}, but needs a string")
    provenance = item.get("provenance", {})
    if not isinstance(provenance, dict) or not isinstance(provenance.get("versions", {}), dict):
        raise ImportProblem(f"{where}.provenance needs an object whose versions is an object")
    if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in provenance.get("versions", {}).items()):
        raise ImportProblem(f"{where}.provenance.versions needs non-empty names mapped to version strings")
    return CacheEntry(device=item["device"], op_id=item["op_id"], call_key=item["call_key"], cfg=item["cfg"],
                      schema=schema, source=source, provenance=provenance)


def parse_export(payload: dict[str, Any], directory: str) -> list[ImportBatch]:
    """Validate an ``ejk cache export`` payload; the batches to write into ``directory``.

    Raises:
        ImportProblem: naming the first bad op, entry or target file.
    """
    ops = payload.get("ops")
    if not isinstance(ops, dict):
        raise ImportProblem(f"ops is {type(ops).__name__}, but needs an object of op name -> entries")
    batches = []
    for name, items in ops.items():
        try:
            path = os.path.join(directory, cache_file_name(name))
        except ValueError as exc:
            raise ImportProblem(str(exc)) from None
        if not isinstance(items, list):
            raise ImportProblem(f"ops[{name!r}] is {type(items).__name__}, but needs a list of entries")
        entries = [_entry(name, i, item) for i, item in enumerate(items)]
        state = read_cache_file(path)
        if state.kind not in ("missing", "ours"):
            raise ImportProblem(f"{state.note or path}; it is not overwritten")
        batches.append((path, name, entries))
    return batches


def import_entries(batches: list[ImportBatch]) -> tuple[int, list[str]]:
    """Merge validated batches into their files; ``(entries written, paths that failed)``."""
    written, failed = 0, []
    for path, _name, entries in batches:
        label = os.path.basename(path)[: -len(".json")]
        cache: PersistentCache[Any] = PersistentCache(label, path)
        cache.put_entries(entries)
        if cache.memory_only:
            failed.append(path)
        else:
            written += len(entries)
    return written, failed
