"""The rich console of the command line: wide enough for tables when output is not a terminal."""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["console"]


def console() -> Console:
    """A console for stdout (160 columns when stdout is not a terminal)."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)
