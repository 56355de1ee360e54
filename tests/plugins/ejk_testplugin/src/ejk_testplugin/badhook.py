"""The ``testbadhook`` entry point: a hook implementation with an argument no hookspec has."""

from __future__ import annotations

from typing import Any

import ejk


@ejk.hookimpl
def ejk_register_kernels(register: Any, registry_version: int) -> None:
    register("testbadhook_op", "testplat", "any")(lambda x: x)
