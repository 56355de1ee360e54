"""Every test runs with a private config cache directory and the team policy on."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJK_CACHE_DIR", str(tmp_path / "ejk-cache"))
    for name in ("EJK_EXAMPLE_POLICY", "EJK_AUTOTUNE", "EJKERNEL_OPS_RECORD"):
        monkeypatch.delenv(name, raising=False)
