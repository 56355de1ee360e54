"""``python -m ejk``: the ``ejk`` command line."""

from __future__ import annotations

import sys

from ejk.cli import main

if __name__ == "__main__":
    sys.exit(main())
