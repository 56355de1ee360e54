"""Benchmark cases (one shape of one op), the presets, and the ``--shapes`` spec syntax."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

import attrs

__all__ = [
    "OP_ALIASES",
    "PRESETS",
    "QUICK",
    "CASE_TYPES",
    "AttentionCase",
    "Case",
    "MatmulCase",
    "MoeCase",
    "PagedCase",
    "parse_shapes",
    "resolve_op",
]


@attrs.frozen(kw_only=True)
class Case:
    """One shape of one op. Subclasses name the op and say where the case sits on a plot.

    ``series`` groups the cases of one curve (every parameter but the swept one); ``x`` is
    the swept value, ``x_name`` what it means.
    """

    op: ClassVar[str] = ""
    x_name: ClassVar[str] = ""

    @property
    def label(self) -> str:
        raise NotImplementedError

    @property
    def series(self) -> str:
        raise NotImplementedError

    @property
    def x(self) -> int:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.label


@attrs.frozen(kw_only=True)
class AttentionCase(Case):
    """``flash_attention`` on ``q [batch, seq, heads, dim]`` and ``k, v [batch, seq, kv_heads, dim]``."""

    op: ClassVar[str] = "flash_attention"
    x_name: ClassVar[str] = "sequence length"
    batch: int
    seq: int
    heads: int
    dim: int
    kv_heads: int = attrs.field()
    causal: bool = False

    @kv_heads.default
    def _all_heads(self) -> int:
        return self.heads

    @property
    def label(self) -> str:
        gqa = f" kv={self.kv_heads}" if self.kv_heads != self.heads else ""
        return f"[{self.batch},{self.seq},{self.heads},{self.dim}]{gqa} {'causal' if self.causal else 'full'}"

    @property
    def series(self) -> str:
        gqa = f" GQA {self.heads // self.kv_heads}:1" if self.kv_heads != self.heads else ""
        return f"D={self.dim} H={self.heads}{gqa} {'causal' if self.causal else 'full'}"

    @property
    def x(self) -> int:
        return self.seq


@attrs.frozen(kw_only=True)
class PagedCase(Case):
    """``ragged_paged_attention``: ``seqs`` sequences of ``ctx`` positions each, the last ``q_len`` new."""

    op: ClassVar[str] = "ragged_paged_attention"
    x_name: ClassVar[str] = "context length"
    seqs: int
    ctx: int
    q_len: int = 1
    hq: int = 32
    hkv: int = 8
    dim: int = 128
    page: int = 64

    @property
    def decode(self) -> bool:
        return self.q_len == 1

    @property
    def kind(self) -> str:
        return "decode" if self.decode else f"prefill q={self.q_len}"

    @property
    def label(self) -> str:
        return f"S={self.seqs} ctx={self.ctx} {self.kind}"

    @property
    def series(self) -> str:
        return f"{self.kind} S={self.seqs} Hq={self.hq} Hkv={self.hkv} D={self.dim}"

    @property
    def x(self) -> int:
        return self.ctx


@attrs.frozen(kw_only=True)
class MoeCase(Case):
    """``grouped_matmul``: ``tokens`` rows of width ``k`` over ``experts`` weights ``[k, n]``."""

    op: ClassVar[str] = "grouped_matmul"
    x_name: ClassVar[str] = "tokens"
    experts: int
    k: int
    n: int
    tokens: int
    skewed: bool = False

    @property
    def label(self) -> str:
        return f"g={self.experts} k={self.k} n={self.n} m={self.tokens} {'skewed' if self.skewed else 'equal'}"

    @property
    def series(self) -> str:
        return f"g={self.experts} k={self.k} n={self.n} {'skewed' if self.skewed else 'equal'}"

    @property
    def x(self) -> int:
        return self.tokens


@attrs.frozen(kw_only=True)
class MatmulCase(Case):
    """``matmul``: ``[m, k] @ [k, n]``."""

    op: ClassVar[str] = "matmul"
    x_name: ClassVar[str] = "m"
    m: int
    k: int
    n: int

    @property
    def label(self) -> str:
        return f"{self.m}x{self.k}x{self.n}"

    @property
    def series(self) -> str:
        return "square" if self.m == self.k == self.n else f"k={self.k} n={self.n}"

    @property
    def x(self) -> int:
        return self.m


#: The case class of each op.
CASE_TYPES: dict[str, type[Case]] = {cls.op: cls for cls in (AttentionCase, PagedCase, MoeCase, MatmulCase)}


# -- presets --------------------------------------------------------------------------------------

_TOKENS = 16384  # the attention sweep keeps batch x seq constant, so each point does similar work


def _attention_preset() -> tuple[Case, ...]:
    seqs = {False: (1024, 4096, 16384), True: (1024, 2048, 4096, 8192, 16384)}
    sweep = tuple(AttentionCase(batch=_TOKENS // s, seq=s, heads=16, dim=128, causal=c)
                  for c in (False, True) for s in seqs[c])
    d64 = tuple(AttentionCase(batch=4, seq=4096, heads=32, dim=64, causal=c) for c in (False, True))
    gqa = (AttentionCase(batch=4, seq=4096, heads=16, kv_heads=4, dim=128, causal=True),)
    return sweep + d64 + gqa


PRESETS: dict[str, tuple[Case, ...]] = {
    # [4,4096,16,128] and [2,8192,16,128] (the plugin issues' shapes) are points of the sweep.
    "attention": _attention_preset(),
    "decode": (
        *(PagedCase(seqs=s, ctx=c) for s in (8, 64) for c in (1024, 4096, 16384, 32768)),
        PagedCase(seqs=4, ctx=2048, q_len=256),  # chunked prefill
    ),
    "moe": (
        *(MoeCase(experts=64, k=2048, n=1536, tokens=t, skewed=s) for s in (False, True) for t in (8192, 32768)),
        MoeCase(experts=8, k=4096, n=14336, tokens=8192, skewed=True),
    ),
    "matmul": (
        *(MatmulCase(m=s, k=s, n=s) for s in (2048, 4096, 8192)),
        *(MatmulCase(m=m, k=4096, n=14336) for m in (2048, 16384)),  # an LLM MLP: up/gate projection
        MatmulCase(m=16384, k=14336, n=4096),  # down projection
        MatmulCase(m=16, k=4096, n=14336),  # decode: memory bound
    ),
}

#: Tiny shapes for ``--quick`` (a minute on a CPU).
QUICK: dict[str, tuple[Case, ...]] = {
    "attention": (AttentionCase(batch=1, seq=64, heads=2, dim=32, causal=True),
                  AttentionCase(batch=1, seq=128, heads=2, dim=32, causal=True)),
    "decode": (PagedCase(seqs=2, ctx=64, hq=4, hkv=2, dim=32, page=16),
               PagedCase(seqs=2, ctx=128, hq=4, hkv=2, dim=32, page=16)),
    "moe": (MoeCase(experts=4, k=32, n=32, tokens=64), MoeCase(experts=4, k=32, n=32, tokens=128, skewed=True)),
    "matmul": (MatmulCase(m=64, k=64, n=64), MatmulCase(m=128, k=128, n=128)),
}

#: Names accepted for each op on the command line (an op name, a preset name or a short alias).
OP_ALIASES: dict[str, str] = {
    "flash_attention": "flash_attention", "attention": "flash_attention",
    "ragged_paged_attention": "ragged_paged_attention", "decode": "ragged_paged_attention",
    "paged": "ragged_paged_attention",
    "grouped_matmul": "grouped_matmul", "moe": "grouped_matmul", "gmm": "grouped_matmul",
    "matmul": "matmul",
}
PRESET_OF_OP = {"flash_attention": "attention", "ragged_paged_attention": "decode", "grouped_matmul": "moe",
                "matmul": "matmul"}


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


def _dims(text: str, count: int, what: str) -> list[int]:
    try:
        dims = [int(part) for part in text.lower().replace("×", "x").split("x")]
    except ValueError:
        dims = []
    if len(dims) != count or min(dims) <= 0:
        raise ValueError(f"--shapes: {text!r} is not {what}")
    return dims


def _options(parts: Sequence[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for part in parts:
        for item in filter(None, part.split(",")):
            key, _, value = item.partition("=")
            options[key.strip().lower()] = value.strip()
    return options


def _ints(options: dict[str, str], allowed: Iterable[str], spec: str) -> dict[str, int]:
    allowed = set(allowed)
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"--shapes {spec!r}: unknown option(s) {', '.join(unknown)}; allowed: "
                         f"{', '.join(sorted(allowed))}")
    try:
        values = {key: int(value) for key, value in options.items() if value}
    except ValueError:
        values = {"": 0}
    if min(values.values(), default=1) < 1:
        raise ValueError(f"--shapes {spec!r}: option values must be positive integers")
    return values


def parse_case(spec: str) -> Case:
    """One case from ``OP:DIMS[:OPTIONS]``, e.g. ``attention:4x4096x16x128:causal,kv=4``.

    - ``attention:BxSxHxD[:causal][,kv=Hkv]``
    - ``decode:SEQSxCTX[:q=1,hq=32,hkv=8,d=128,page=64]``
    - ``moe:GxKxNxM[:skewed]`` (experts, k, n, tokens)
    - ``matmul:MxKxN``

    Raises:
        ValueError: naming the spec and the expected form.
    """
    op_text, _, rest = spec.partition(":")
    op = resolve_op(op_text)
    dims_text, *option_parts = rest.split(":") if rest else [""]
    options = _options(option_parts)
    if op == "flash_attention":
        b, s, h, d = _dims(dims_text, 4, "BxSxHxD, e.g. 4x4096x16x128")
        causal = "causal" in options
        options.pop("causal", None)
        opts = _ints(options, ("kv",), spec)
        if h % opts.get("kv", h):
            raise ValueError(f"--shapes {spec!r}: kv={opts['kv']} must divide the {h} query heads")
        return AttentionCase(batch=b, seq=s, heads=h, dim=d, kv_heads=opts.get("kv", h), causal=causal)
    if op == "ragged_paged_attention":
        seqs, ctx = _dims(dims_text, 2, "SEQSxCTX, e.g. 8x4096")
        opts = _ints(options, ("q", "hq", "hkv", "d", "page"), spec)
        return PagedCase(seqs=seqs, ctx=ctx, q_len=opts.get("q", 1), hq=opts.get("hq", 32),
                         hkv=opts.get("hkv", 8), dim=opts.get("d", 128), page=opts.get("page", 64))
    if op == "grouped_matmul":
        g, k, n, m = _dims(dims_text, 4, "GxKxNxM (experts, k, n, tokens), e.g. 64x2048x1536x32768")
        skewed = "skewed" in options
        options.pop("skewed", None)
        options.pop("equal", None)
        _ints(options, (), spec)
        return MoeCase(experts=g, k=k, n=n, tokens=m, skewed=skewed)
    m, k, n = _dims(dims_text, 3, "MxKxN, e.g. 4096x4096x4096")
    _ints(options, (), spec)
    return MatmulCase(m=m, k=k, n=n)


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
