"""Argument checks shared by every operation's validator: one rule each for floating dtypes,
``softmax_scale``, sliding windows, array-likes, counts, and the matmul ``precision`` /
``preferred_element_type``."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "FLOAT_DTYPES",
    "as_array",
    "attention_precision",
    "dtype_name",
    "float_dtype_problem",
    "is_int",
    "is_real",
    "matmul_precision",
    "normalize_window",
    "optional_positive",
    "preferred_element_type",
    "scalar_count",
    "softmax_scale",
]


#: The one dtype rule of every op's floating inputs. float64 is rejected, not computed at float32
#: accuracy behind the user's back: the kernels accumulate in float32 (cast inputs to float32).
FLOAT_DTYPES = ("bfloat16", "float16", "float32")


_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """``np.dtype(dtype).name``, memoised (NumPy builds the name in Python, on every eager call otherwise)."""
    try:
        return _DTYPE_NAMES[dtype]
    except (KeyError, TypeError):
        pass
    name = str(np.dtype(dtype).name)
    if len(_DTYPE_NAMES) < 256:
        try:
            _DTYPE_NAMES[dtype] = name
        except TypeError:
            pass
    return name


def float_dtype_problem(dtype: Any) -> str | None:
    """``None`` for a supported floating dtype, else what is needed (for ``"<x> has dtype … but needs …"``)."""
    name = dtype_name(dtype)
    if name in FLOAT_DTYPES:
        return None
    hint = " (float64 is not supported: cast to float32)" if name == "float64" else ""
    return f"a floating dtype: one of {', '.join(FLOAT_DTYPES)}{hint}"


def is_int(value: Any) -> bool:
    """An integral number that is not a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A real number that is not a ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def normalize_window(
    op: str,
    name: str,
    window: Any,
    *,
    causal: bool,
    max_left: int | None = None,
    max_right: int | None = None,
) -> tuple[int, int] | None:
    """``None``, ``w`` or ``(left, right)`` of non-negative ints → ``(left, right)``; causal forces right = 0.

    With ``causal=True`` the right side is dropped (``(3, 7)`` means ``(3, 0)``): nothing to
    the right of a query is visible anyway. Each side is then clamped to the largest
    distance that can occur (``max_left`` / ``max_right``, from the sequence lengths), so a
    window of any size, ``2**31 - 1`` or more included, means the same as the whole
    sequence and never overflows an int32 index inside a kernel.

    Args:
        op: Operation name, for the error message.
        name: Argument name, for the error message.
        window: The user's value.
        causal: Whether attention is causal.
        max_left: Clamp for ``left`` (``Sk - 1`` for flash attention); ``None``: no clamp.
        max_right: Clamp for ``right`` (``Sq - 1`` for flash attention); ``None``: no clamp.

    Raises:
        ValueError: ``"<op>: <name> is <value> but needs non-negative ints …"``.
    """
    if window is None:
        return None
    if is_int(window):
        pair: tuple[Any, ...] = (window, window)
    elif isinstance(window, Sequence) and not isinstance(window, str) and len(window) == 2:
        pair = tuple(window)
    else:
        pair = ()
    if not pair or not all(is_int(x) and x >= 0 for x in pair):
        raise ValueError(
            f"{op}: {name} is {window!r} but needs non-negative ints: None, an int w, or a (left, right) pair"
        )
    left, right = int(pair[0]), 0 if causal else int(pair[1])
    if max_left is not None:
        left = min(left, max(int(max_left), 0))
    if max_right is not None:
        right = min(right, max(int(max_right), 0))
    return (left, right)


def optional_positive(op: str, name: str, value: Any) -> float | None:
    """``None`` or a finite number > 0, as a float.

    Raises:
        ValueError: ``"<op>: <name> is <value> but needs a finite number > 0 or None"``.
    """
    if value is None:
        return None
    if not is_real(value) or not (0 < float(value) < math.inf):
        raise ValueError(f"{op}: {name} is {value!r} but needs a finite number > 0 or None")
    return float(value)


def softmax_scale(op: str, value: Any, head_dim: int) -> float:
    """The one rule of every op: ``None`` (then ``1/sqrt(head_dim)``) or a finite number > 0.

    Raises:
        ValueError: ``"<op>: softmax_scale is <value> but needs a finite number > 0 or None …"``.
    """
    if value is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if not is_real(value) or not (0 < float(value) < math.inf):
        raise ValueError(
            f"{op}: softmax_scale is {value!r} but needs a finite number > 0 or None (1/sqrt(head_dim)); "
            "flip the sign of q instead of the scale"
        )
    return float(value)


_INT32 = np.iinfo(np.int32)


def _require_int32(op: str, name: str, host: np.ndarray[Any, Any]) -> None:
    """Integer values given on the host must fit int32 while JAX computes in 32 bits (x64 off):
    checked before the conversion, which would wrap them."""
    import jax

    if host.size == 0 or not np.issubdtype(host.dtype, np.integer) or jax.config.read("jax_enable_x64"):
        return
    low, high = int(host.min()), int(host.max())
    if low < _INT32.min or high > _INT32.max:
        bad = high if high > _INT32.max else low
        raise ValueError(f"{op}: {name} holds {bad}, which does not fit int32 (JAX converts integers to int32 "
                         "unless jax_enable_x64 is on, which would wrap it): pass values in "
                         f"[{_INT32.min}, {_INT32.max}], or enable x64 (jax.config.update('jax_enable_x64', True))")


def as_array(op: str, name: str, value: Any) -> Any:
    """Python lists / tuples and NumPy values → a JAX array (as ``jnp.asarray``); arrays, tracers
    and ``jax.ShapeDtypeStruct`` pass through unchanged.

    Checked before converting: NumPy float64 values are refused, as every op refuses float64 arrays
    (a Python list of floats becomes JAX's default float dtype, as in ``jnp.asarray``), and integers
    must fit int32 unless x64 is on (the conversion would wrap them).

    Raises:
        ValueError: when the value cannot be an array (ragged lists, strings inside …), is NumPy
            float64, or holds integers that do not fit int32.
    """
    if not isinstance(value, list | tuple | np.ndarray | np.generic):
        return value
    import jax.numpy as jnp

    try:
        host = np.asarray(value)
        if host.dtype == object or not (np.issubdtype(host.dtype, np.number) or host.dtype == np.bool_):
            raise TypeError(f"its elements are {host.dtype}")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{op}: {name} is {value!r:.60} but needs an array (a list converts only when it is "
                         f"rectangular and numeric): {exc}") from None
    if isinstance(value, np.ndarray | np.generic) and (needs := float_dtype_problem(host.dtype)) is not None \
            and np.issubdtype(host.dtype, np.floating):
        raise ValueError(f"{op}: {name} has dtype {host.dtype} but needs {needs}")
    _require_int32(op, name, host)
    return jnp.asarray(value)


def scalar_count(op: str, name: str, value: Any) -> Any:
    """An integer count given as a Python / NumPy int or an integer array of shape ``()`` / ``(1,)``.

    ``bool``, floats (``1.7``) and strings (``"2"``) are rejected rather than truncated.

    Returns:
        The count as an int32 JAX array (or tracer).

    Raises:
        ValueError: naming the argument, what it got and what it needs.
    """
    import jax.numpy as jnp

    needs = "an int (not a bool or a float) or an integer array of shape ()"
    if isinstance(value, bool | np.bool_ | str | bytes | float | complex):
        raise ValueError(f"{op}: {name} is {value!r} but needs {needs}")
    if is_int(value):
        if not -(2**31) <= int(value) < 2**31:
            raise ValueError(f"{op}: {name} is {value!r} but needs a value that fits int32")
        return jnp.asarray(int(value), dtype=jnp.int32)
    dtype = getattr(value, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_):
        raise ValueError(f"{op}: {name} is {value!r:.60} but needs {needs}")
    if isinstance(value, np.ndarray | np.generic):  # on the host: check before int32 wraps it
        _require_int32(op, name, np.asarray(value))
    return jnp.asarray(value, dtype=jnp.int32)


_PRECISION_NEEDS = (
    "needs None (JAX's default: jax_default_matmul_precision, else 'default'), one of 'default', 'high', "
    "'highest' (or JAX's aliases 'fastest', 'bfloat16', 'tensorfloat32', 'bfloat16_3x', 'float32'), a "
    "jax.lax.Precision, or a pair of these (lhs, rhs); jax.lax.DotAlgorithm(Preset) is not supported "
    "(ejk accumulates in float32: pick the output dtype with preferred_element_type)"
)


def _precision_name(value: Any) -> str | None:
    """``"default"`` / ``"high"`` / ``"highest"`` for a ``lax.Precision`` or one of JAX's names, else ``None``."""
    from jax import lax

    if isinstance(value, lax.Precision):
        return value.name.lower()
    if isinstance(value, str):
        try:
            return lax.Precision(value.strip().lower()).name.lower()
        except ValueError:
            return None
    return None


def matmul_precision(op: str, value: Any) -> tuple[str, str]:
    """The one ``precision`` rule of the matmul-like ops, as in ``jax.lax.dot_general``.

    ``None`` means what it means in JAX: ``jax_default_matmul_precision`` (read when the op is
    called, so ``with jax.default_matmul_precision(...)`` applies), else ``"default"``. A
    ``jax.lax.DotAlgorithm`` or preset is rejected: it fixes the accumulation type, and ejk's
    kernels always accumulate in float32.

    Returns:
        ``(lhs, rhs)``: the names of ``jax.lax.Precision`` members (``"default"``, ``"high"`` or
        ``"highest"``), one per operand, as every matmul-like op passes them to implementations.

    Raises:
        ValueError: ``"<op>: precision is <value> but needs …"``.
    """
    import jax

    given = value
    if value is None:
        value = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]  # honours the context manager
        if value is None:
            return ("default", "default")
    try:
        pair = _precision_pair(value)
    except TypeError:  # unhashable (a list): the same rule, uncached
        pair = _precision_pair.__wrapped__(value)
    if pair is not None:
        return pair
    source = "" if given is not None else f" (from jax_default_matmul_precision={value!r})"
    raise ValueError(f"{op}: precision is {given!r}{source} but {_PRECISION_NEEDS}")


def attention_precision(op: str, value: Any, dtype: Any) -> str:
    """The ``precision`` rule of the attention ops: one name for both of their products.

    ``value`` is read as for :func:`matmul_precision` (``None``: ``jax_default_matmul_precision``,
    else ``"default"``) but must name one precision, not an ``(lhs, rhs)`` pair. It only matters
    for float32 inputs: bfloat16 and float16 products are exact in the float32 accumulators every
    kernel uses, so for those dtypes it is normalised to ``"default"`` (one compiled program, one
    tuning entry, whatever was asked).

    Returns:
        ``"default"``, ``"high"`` or ``"highest"``.

    Raises:
        ValueError: ``"<op>: precision is <value> but needs …"``.
    """
    import jax.numpy as jnp

    lhs, rhs = matmul_precision(op, value)
    if lhs != rhs:
        raise ValueError(f"{op}: precision is {value!r} but needs one precision for both products of attention "
                         "('default', 'high', 'highest', a jax.lax.Precision or None), not an (lhs, rhs) pair")
    return lhs if jnp.dtype(dtype) == jnp.float32 else "default"


@functools.lru_cache(maxsize=64)
def _precision_pair(value: Any) -> tuple[str, str] | None:
    """``(lhs, rhs)`` precision names for one precision value, ``None`` when it is not one (cached:
    eager calls of the matmul-like ops resolve the same few values over and over)."""
    single = _precision_name(value)
    if single is not None:
        return (single, single)
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        pair = (_precision_name(value[0]), _precision_name(value[1]))
        if pair[0] is not None and pair[1] is not None:
            return (pair[0], pair[1])
    return None


def result_dtype(*dtypes: Any) -> np.dtype[Any]:
    """``jnp.result_type`` of some dtypes under the current promotion settings, cached (uncached it is
    one of the largest host costs of an eager call: ``benchmarks/results/core_h100.md``)."""
    import jax

    config = jax.config
    return _result_dtype(dtypes, config.jax_numpy_dtype_promotion, config.jax_enable_x64)  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=256)
def _result_dtype(dtypes: tuple[Any, ...], promotion: str, x64: bool) -> np.dtype[Any]:
    import jax.numpy as jnp

    del promotion, x64  # part of the cache key: jnp.result_type reads them from the config
    return np.dtype(jnp.result_type(*dtypes))


def preferred_element_type(op: str, value: Any, default: Any, *, default_means: str) -> np.dtype[Any]:
    """The one ``preferred_element_type`` rule of the matmul-like ops: the *output* dtype.

    ``None`` gives ``default``; otherwise a floating dtype of :data:`FLOAT_DTYPES`. The
    kernels accumulate in float32 whatever the output dtype (as ``jnp.matmul`` does on GPUs and
    TPUs for 16-bit inputs), so this only chooses the one final rounding.

    Args:
        op: Operation name, for the error message.
        value: The user's value: ``None`` or anything ``numpy.dtype`` accepts.
        default: The dtype ``None`` stands for.
        default_means: How the error message describes the default, e.g. ``"result_type(a, b)"``.

    Raises:
        ValueError: ``"<op>: preferred_element_type is <value> but needs None (…) or a floating dtype …"``.
    """
    if value is None:
        resolved: np.dtype[Any] = np.dtype(default)
        return resolved
    try:
        dtype: np.dtype[Any] = np.dtype(value)
    except TypeError:
        raise ValueError(f"{op}: preferred_element_type is {value!r} but needs None ({default_means}) or a "
                         f"floating dtype: one of {', '.join(FLOAT_DTYPES)}") from None
    problem = float_dtype_problem(dtype)
    if problem is not None:
        raise ValueError(f"{op}: preferred_element_type is {dtype.name} but needs None ({default_means}) or {problem}")
    return dtype
