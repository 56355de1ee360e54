"""Benchmark cases (one shape of one op), the presets, and the ``--shapes`` spec syntax.

Each op brings its own (its :class:`~ejk.ops.OpDefinition`'s ``bench``, an
:class:`ejk.ops._workload.OpBench`); this module gathers those of the built-in ops.
"""

from __future__ import annotations

from collections.abc import Sequence

from ejk.ops import builtin_ops
from ejk.ops._flash_attention._bench import AttentionCase
from ejk.ops._grouped_matmul._bench import MoeCase
from ejk.ops._matmul._bench import MatmulCase
from ejk.ops._mla_paged_attention._bench import MlaCase
from ejk.ops._ragged_paged_attention._bench import PagedCase
from ejk.ops._workload import Case, OpBench

__all__ = [
    "OP_ALIASES",
    "PRESETS",
    "QUICK",
    "CASE_TYPES",
    "AttentionCase",
    "Case",
    "MatmulCase",
    "MlaCase",
    "MoeCase",
    "PagedCase",
    "parse_shapes",
    "resolve_op",
]

#: The bench part of each built-in op, by op name.
BENCHES: dict[str, OpBench] = {d.name: bench for d in builtin_ops() if (bench := d.bench_spec()) is not None}

#: The case class of each op.
CASE_TYPES: dict[str, type[Case]] = {op: bench.case for op, bench in BENCHES.items()}
PRESETS: dict[str, tuple[Case, ...]] = {bench.preset: bench.presets for bench in BENCHES.values()}
#: Tiny shapes for ``--quick`` (a minute on a CPU).
QUICK: dict[str, tuple[Case, ...]] = {bench.preset: bench.quick for bench in BENCHES.values()}
#: Names accepted for each op on the command line (an op name, a preset name or a short alias).
OP_ALIASES: dict[str, str] = {name: op for op, bench in BENCHES.items()
                              for name in (op, bench.preset, *bench.aliases)}
PRESET_OF_OP = {op: bench.preset for op, bench in BENCHES.items()}


def resolve_op(name: str) -> str:
    """The op an OP argument names.

    Raises:
        ValueError: naming the accepted names.
    """
    try:
        return OP_ALIASES[name.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; use one of: {', '.join(sorted(OP_ALIASES))}") from None


# -- the --shapes spec syntax ---------------------------------------------------------------------


def _options(parts: Sequence[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for part in parts:
        for item in filter(None, part.split(",")):
            key, _, value = item.partition("=")
            options[key.strip().lower()] = value.strip()
    return options


def parse_case(spec: str) -> Case:
    """One case from ``OP:DIMS[:OPTIONS]``, e.g. ``attention:4x4096x16x128:causal,kv=4``.

    - ``attention:BxSxHxD[:causal][,kv=Hkv]``
    - ``decode:SEQSxCTX[:q=1,hq=32,hkv=8,d=128,page=64]``
    - ``moe:GxKxNxM[:skewed]`` (experts, k, n, tokens)
    - ``matmul:MxKxN``
    - ``lce:TxHxV[:zloss][,smooth]`` (tokens, hidden, vocabulary; z-loss 1e-4, label smoothing 0.1)
    - ``rmsnorm:RxD[:residual]`` (rows, width; ``residual=`` passed)

    Raises:
        ValueError: naming the spec and the expected form.
    """
    op_text, _, rest = spec.partition(":")
    op = resolve_op(op_text)
    dims_text, *option_parts = rest.split(":") if rest else [""]
    return BENCHES[op].parse(dims_text, _options(option_parts), spec)


def parse_shapes(texts: Sequence[str], *, quick: bool = False) -> list[Case]:
    """Cases from ``--shapes`` values: preset names (``attention``, ``decode``, ``moe``, ``matmul``) or
    specs (see :func:`parse_case`); several in one value are separated by ``;``."""
    presets = QUICK if quick else PRESETS
    cases: list[Case] = []
    for text in texts:
        for item in filter(None, (part.strip() for part in text.split(";"))):
            if item in presets:
                cases.extend(presets[item])
            elif ":" in item:
                cases.append(parse_case(item))
            else:
                raise ValueError(f"--shapes {item!r}: not a preset ({', '.join(presets)}) nor a spec "
                                 "such as attention:4x4096x16x128:causal")
    return cases
