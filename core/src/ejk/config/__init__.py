"""Config caches and config selection."""

from __future__ import annotations

from ejk.config.cache import ConfigCache, overlay_cache, overlay_lookup
from ejk.config.persistent import PersistentCache

__all__ = ["ConfigCache", "PersistentCache", "overlay_cache", "overlay_lookup"]
