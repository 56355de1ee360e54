"""Loop carries under ``shard_map`` vary along the data's mesh axes (the shared core helper)."""

from __future__ import annotations

from ejk.parallel import varying_like

__all__ = ["varying_like"]
