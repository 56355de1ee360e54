"""The ``testbroken`` entry point: its toolkit is missing, so the import fails."""

from __future__ import annotations

import ejk_testplugin_missing_toolkit  # noqa: F401  (deliberately not installed)
