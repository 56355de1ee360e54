"""The ``testraises`` entry point: raises in ``ejk_register_kernels`` after registering one kernel."""

from __future__ import annotations

from typing import Any

import ejk


def _identity(x: Any, *, cfg: Any = None) -> Any:
    return x


@ejk.hookimpl
def ejk_register_kernels(register: Any) -> None:
    register("testraises_op", "testplat", "any")(_identity)
    raise RuntimeError("testraises: cannot initialise the device library")
