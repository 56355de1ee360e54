"""Safe, reversible file names for op ids in the cache directory.

An op id becomes a file name by percent-encoding (UTF-8, upper-case hex) every character
but ASCII letters, digits and ``_ - @ +``. ``.`` and ``/`` are encoded too, so a name can
never leave the directory (``../x``), never be hidden, and never collide with a user's
``notes.json``: ``"team/x"`` → ``team%2Fx.json``, ``"notes.json"`` → ``notes%2Ejson.json``.
Plain ids such as ``flash_attention`` keep their old file names.
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["MAX_NAME_LENGTH", "cache_file_name", "op_id_of_file_name"]

MAX_NAME_LENGTH = 200  # file systems allow 255 bytes; leave room for ".json.lock" and ".corrupt-…"
_KEPT = re.compile(r"[A-Za-z0-9_@+-]")
_ENCODED = re.compile(r"^(?:[A-Za-z0-9_@+-]|%[0-9A-F]{2})+\.json$")


def cache_file_name(op_id: str) -> str:
    """The file name (``<encoded op id>.json``) of ``op_id``'s cache file.

    Raises:
        ValueError: when ``op_id`` is not a non-empty string, or is too long to encode.
    """
    if not isinstance(op_id, str) or not op_id:
        raise ValueError(f"op id {op_id!r} cannot name a cache file: it needs a non-empty string")
    try:
        encoded = "".join(ch if _KEPT.fullmatch(ch) else "".join(f"%{b:02X}" for b in ch.encode()) for ch in op_id)
    except UnicodeEncodeError:  # a lone surrogate
        raise ValueError(f"op id {op_id!r} cannot name a cache file: it is not valid Unicode text") from None
    if len(encoded) > MAX_NAME_LENGTH:
        raise ValueError(
            f"op id {op_id[:40]!r}... is too long for a cache file name ({len(encoded)} characters encoded, "
            f"at most {MAX_NAME_LENGTH}); use a shorter op_id"
        )
    return encoded + ".json"


def op_id_of_file_name(name: str) -> str | None:
    """The op id a file name encodes, or ``None`` when it is not such a name (e.g. ``matmul (copy).json``)."""
    if not _ENCODED.match(name):
        return None
    try:
        op_id = urllib.parse.unquote(name[: -len(".json")], errors="strict")
    except UnicodeDecodeError:
        return None
    return op_id if cache_file_name(op_id) == name else None
