"""``ejk explain``: which implementation and config a call would use, and why not the others."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser"]

#: The ops with their own shape options; every other op (ragged_paged_attention, plugins' ops and
#: algorithms) is described with --arg and --static, or runs its first sample call.
_OPS = ("flash_attention", "matmul", "grouped_matmul")


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(part) for part in text.lower().replace("×", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape like 4x4096x16x128") from None
    if not dims or min(dims) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape like 4x4096x16x128")
    return dims


def _shape_of(form: str, example: str) -> Any:
    """A shape type with ``form``'s number of dimensions (``form`` like ``B x Sq x Hq x D``)."""
    rank = form.count("x") + 1

    def parse(text: str) -> tuple[int, ...]:
        dims = _shape(text)
        if len(dims) != rank:
            raise argparse.ArgumentTypeError(f"{text!r} has {len(dims)} dimension(s), but needs {rank}: "
                                             f"{form}, e.g. {example}")
        return dims

    return parse


def _window(text: str) -> int | tuple[int, int]:
    try:
        parts = [int(p) for p in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2):
        raise argparse.ArgumentTypeError(f"{text!r} is not a sliding window: w, or left,right (e.g. 128 or 128,0)")
    return parts[0] if len(parts) == 1 else (parts[0], parts[1])


def _dtype(text: str) -> str:
    import jax.numpy as jnp

    try:
        return jnp.dtype(text).name
    except TypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a dtype; use e.g. bfloat16, float16 or float32") from None


def _array_arg(text: str) -> tuple[str, tuple[int, ...], str | None]:
    """``NAME=SHAPE[:DTYPE]``, e.g. ``kv_lens=8:int32``."""
    name, eq, rest = text.partition("=")
    shape, _, dtype = rest.partition(":")
    if not eq or not name.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=SHAPE[:DTYPE], e.g. x=8x4096 or kv_lens=8:int32")
    return name.strip(), _shape(shape), _dtype(dtype) if dtype else None


def _static_arg(text: str) -> tuple[str, Any]:
    """``NAME=VALUE``; the value a Python literal (``1e-6``, ``True``, ``(128, 0)``), else the text."""
    import ast

    name, eq, value = text.partition("=")
    if not eq or not name.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE, e.g. eps=1e-6 or causal=True")
    try:
        return name.strip(), ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name.strip(), value


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "explain", help="which implementation and config a call would use, from which tier, and why not the others",
        description="Shapes are written 4x4096x16x128. Nothing runs and nothing is tuned. Every defined op "
                    "(built-in or a plugin's) and registered algorithm can be explained: "
                    f"{', '.join(_OPS)} take the options below, any op takes --arg/--static, and an op "
                    "given no arguments explains its first sample call.",
    )
    p.add_argument("op", help="an op (e.g. flash_attention, ragged_paged_attention, a plugin's op) or algorithm")
    p.add_argument("--dtype", type=_dtype, default="bfloat16",
                   help="element type of the float inputs (default bfloat16)")
    p.add_argument("--platform", default="auto", help="force a platform, as the op's platform= argument")
    p.add_argument("--json", action="store_true")
    attention = p.add_argument_group("flash_attention")
    attention.add_argument("--q", type=_shape_of("B x Sq x Hq x D", "4x4096x16x128"),
                           help="query shape B x Sq x Hq x D")
    attention.add_argument("--kv-heads", type=int, help="key/value heads (default: Hq)")
    attention.add_argument("--kv-len", type=int, help="key/value length (default: Sq)")
    attention.add_argument("--causal", action="store_true")
    attention.add_argument("--window", type=_window, help="sliding window: w or left,right")
    attention.add_argument("--soft-cap", type=float)
    attention.add_argument("--segment-ids", action="store_true", help="the call passes segment ids")
    attention.add_argument("--bias", type=_shape, help="bias shape, e.g. 1x16x4096x4096")
    matmuls = p.add_argument_group("matmul / grouped_matmul")
    matmuls.add_argument("--a", type=_shape, help="matmul lhs shape [..., m, k] or [k]")
    matmuls.add_argument("--b", type=_shape, help="matmul rhs shape [..., k, n] or [k] (batch dims broadcast)")
    matmuls.add_argument("--lhs", type=_shape_of("m x k", "4096x2048"), help="grouped_matmul lhs shape m x k")
    matmuls.add_argument("--rhs", type=_shape_of("g x k x n", "8x2048x1536"),
                         help="grouped_matmul rhs shape g x k x n")
    matmuls.add_argument("--precision", default="highest", help="precision of the products (default highest)")
    matmuls.add_argument("--preferred-element-type", type=_dtype,
                         help="output dtype (default: the op's, from the inputs)")
    generic = p.add_argument_group("any op")
    generic.add_argument("--arg", type=_array_arg, action="append", default=[], metavar="NAME=SHAPE[:DTYPE]",
                         help="an array argument by name (dtype default: --dtype), e.g. --arg kv_lens=8:int32; "
                              "repeat it; arrays of an algorithm without an op go in the order given")
    generic.add_argument("--static", type=_static_arg, action="append", default=[], metavar="NAME=VALUE",
                         help="a non-array argument, e.g. --static eps=1e-6; repeat it")
    p.set_defaults(func=run)


def _generic_call(args: argparse.Namespace) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call --arg / --static describe (the op's first sample call when they describe nothing):
    arrays that are positional parameters of the op's public function go positionally."""
    import inspect

    import jax
    import jax.numpy as jnp

    from ejk.ops import OPS, get_op
    from ejk.registry import kernel_registry

    definition = OPS.get(args.op)
    if definition is None and args.op.strip().lower() not in kernel_registry.list_algorithms():
        get_op(args.op)  # raises: unknown operation, naming the known ones
        definition = OPS[args.op]  # a plugin defined it while loading
    if not args.arg and not args.static:
        samples = [] if definition is None else definition.sample_calls()
        if not samples:
            raise SystemExit(f"ejk explain {args.op}: describe the call with --arg NAME=SHAPE[:DTYPE] "
                             "(and --static NAME=VALUE)")
        return samples[0]
    arrays = {name: jax.ShapeDtypeStruct(shape, jnp.dtype(dtype or args.dtype)) for name, shape, dtype in args.arg}
    kwargs: dict[str, Any] = dict(args.static)
    if definition is None:  # an algorithm without an op: its arrays are positional
        return tuple(arrays.values()), kwargs
    params = inspect.signature(definition.function).parameters.values()
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    missing = [name for name in positional if name not in arrays and name not in kwargs]
    if missing:
        raise SystemExit(f"ejk explain {args.op}: --arg {missing[0]}=SHAPE[:DTYPE] (or --static {missing[0]}=VALUE) "
                         f"is required (its positional arguments: {', '.join(positional)})")
    call = tuple(arrays.pop(name) if name in arrays else kwargs.pop(name) for name in positional)
    return call, {**arrays, **kwargs}


def _call(args: argparse.Namespace) -> tuple[tuple[Any, ...], dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    if args.op not in _OPS or args.arg or args.static:
        return _generic_call(args)
    dtype = jnp.dtype(args.dtype)

    def need(name: str) -> Any:
        value = getattr(args, name)
        if value is None:
            raise SystemExit(f"ejk explain {args.op}: --{name.replace('_', '-')} is required")
        return value

    if args.op == "flash_attention":
        batch, q_len, heads, dim = need("q")
        kv_heads = args.kv_heads or heads
        kv_len = args.kv_len if args.kv_len is not None else q_len
        q = jax.ShapeDtypeStruct((batch, q_len, heads, dim), dtype)
        kv = jax.ShapeDtypeStruct((batch, kv_len, kv_heads, dim), dtype)
        kwargs: dict[str, Any] = {"causal": args.causal, "sliding_window": args.window,
                                  "logits_soft_cap": args.soft_cap}
        if args.segment_ids:
            kwargs["q_segment_ids"] = jax.ShapeDtypeStruct((batch, q_len), jnp.int32)
            kwargs["kv_segment_ids"] = jax.ShapeDtypeStruct((batch, kv_len), jnp.int32)
        if args.bias is not None:
            kwargs["bias"] = jax.ShapeDtypeStruct(args.bias, dtype)
        return (q, kv, kv), kwargs
    numerics = {"precision": args.precision, "preferred_element_type": args.preferred_element_type}
    if args.op == "matmul":
        return (jax.ShapeDtypeStruct(need("a"), dtype), jax.ShapeDtypeStruct(need("b"), dtype)), numerics
    lhs, rhs = need("lhs"), need("rhs")
    return (jax.ShapeDtypeStruct(lhs, dtype), jax.ShapeDtypeStruct(rhs, dtype),
            jax.ShapeDtypeStruct((rhs[0],), jnp.int32)), numerics


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    import ejk
    from ejk._console import console as make_console

    try:
        call_args, kwargs = _call(args)
        found = ejk.explain(args.op, *call_args, platform=args.platform, **kwargs)
    except ValueError as exc:
        if args.json:
            print(json.dumps({"error": str(exc)}))
        else:
            make_console().print(f"[red]{escape(str(exc))}[/red]")
        return 2
    if args.json:
        print(json.dumps(found.to_json(), indent=2, default=str))
        return 0
    console = make_console()
    console.print(f"[bold]{escape(found.call)}[/bold]")
    console.print(f"decided by the [bold]{found.tier}[/bold] tier: {escape(str(found.chosen))}"
                  + (f" ({escape(found.detail)})" if found.detail else ""))
    if found.ranking:
        console.print(f"first in the heuristics tier's order: {found.ranking}", markup=False)
    table = Table(title="implementations")
    for column in ("implementation", "plugin", "status", "why not / measured"):
        table.add_column(column)
    colours = {"chosen": "green", "usable": "cyan", "refused": "yellow", "unavailable": "red",
               "not requested": "dim"}
    for report in found.implementations:
        colour = colours.get(report.status, "white")
        label = report.label if report.backward is None else f"{report.label}\nbackward: {report.backward}"
        table.add_row(escape(label), escape(report.plugin or "-"), f"[{colour}]{report.status}[/{colour}]",
                      escape(report.reason or ""))
    console.print(table)
    return 0
