"""Kernels, invocations and the Executor."""

from __future__ import annotations

from ejk.execution.device import device_fingerprint
from ejk.execution.executor import ConfigChooser, Executor
from ejk.execution.kernel import Invocation, Kernel, make_call_key

__all__ = ["ConfigChooser", "Executor", "Invocation", "Kernel", "device_fingerprint", "make_call_key"]
