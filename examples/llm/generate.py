"""`python examples/llm/generate.py --help`: runs ejk_llm.generate from this checkout (or the installed package)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "src"))

from ejk_llm.generate import main

if __name__ == "__main__":
    main()
