"""``ejk explain``: which implementation and config a call would use, and why not the others."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser"]

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


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "explain", help="which implementation and config a call would use, from which tier, and why not the others",
        description="Shapes are written 4x4096x16x128. Nothing runs and nothing is tuned.",
    )
    p.add_argument("op", choices=_OPS)
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
    p.set_defaults(func=run)


def _call(args: argparse.Namespace) -> tuple[tuple[Any, ...], dict[str, Any]]:
    import jax
    import jax.numpy as jnp

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

    call_args, kwargs = _call(args)
    try:
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
