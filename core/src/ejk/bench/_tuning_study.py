"""The tuning study: how long autotuning ``platform="auto"`` takes, per number of compile threads.

For each case, mode and setting of :attr:`ejk.AutotunePolicy.compile_workers`, the public op is
tuned over every usable implementation's configs (persistence off), by default in a fresh
interpreter per setting, so no compilation is reused from an earlier setting. Each setting is one
line (group ``tuning <mode>``): the wall time of the whole tuning run as its time, the compile
phase's wall time as its compile time, the winner as its config and the candidates' counts in the
note. Run as ``python -m ejk.bench._tuning_study REQUEST`` it is that fresh interpreter: it tunes
the JSON request and prints the result as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from ejk.bench._cases import CASE_TYPES, Case
from ejk.bench._runner import Measurement, Options, _failure
from ejk.bench._workloads import workload_for

__all__ = ["run_tuning", "tune_once"]

#: The policy fields a request carries to the fresh interpreter.
_POLICY_FIELDS = ("warmup", "repeats", "min_sample_seconds", "clock", "flush_l2", "l2_flush_bytes")


def tune_once(case: Case, options: Options, mode: str, workers: int) -> dict[str, Any]:
    """Tune ``case``'s public op (``platform="auto"``) in this interpreter; the numbers as a dict."""
    import ejk
    from ejk.ops import get_op

    workload = workload_for(case, options.dtype)
    policy = attrs.evolve(options.policy, mode="autotune", persist=False, progress=False, max_candidates=None,
                          max_seconds=options.tune_seconds, compile_workers=workers,
                          objective="forward" if mode == "fwd" else "forward_backward")
    events: list[Any] = []
    chain: ejk.ConfigSelectorChain[Any] = ejk.ConfigSelectorChain(policy=policy, persist=False,
                                                                   on_event=events.append)
    kernel = get_op(workload.op).kernel
    arrays, static = workload.normalize(workload.inputs(options.seed))
    choice = ejk.Executor(chain).choose_config(kernel, *arrays, platform="auto", **static)
    tuned = [e.tune for e in events if e.tune is not None]
    if not tuned:
        raise RuntimeError(f"nothing was tuned (chosen by the {events[-1].tier if events else '?'} tier)")
    result = tuned[-1]
    compiled = [t.compile_seconds for t in result.trials if t.compile_seconds is not None]
    return {"wall_s": result.wall_seconds, "compile_wall_s": result.compile_wall_seconds,
            "workers": result.compile_workers, "describe": result.describe(), "best": repr(choice.cfg),
            "implementation": kernel.cfg_label(choice),
            "compile_s_per_candidate": sum(compiled) / len(compiled) if compiled else None}


def _request(case: Case, options: Options, mode: str, workers: int) -> dict[str, Any]:
    return {"op": case.op, "case": attrs.asdict(case), "dtype": options.dtype, "mode": mode, "workers": workers,
            "seed": options.seed, "tune_seconds": options.tune_seconds,
            "policy": {name: getattr(options.policy, name) for name in _POLICY_FIELDS}}


def _from_request(request: dict[str, Any]) -> tuple[Case, Options, str, int]:
    case = CASE_TYPES[request["op"]](**request["case"])
    options = Options(dtype=request["dtype"], seed=request["seed"], tune_seconds=request["tune_seconds"],
                      policy=attrs.evolve(Options().policy, **request["policy"]))
    return case, options, request["mode"], request["workers"]


def _in_fresh_interpreter(case: Case, options: Options, mode: str, workers: int) -> dict[str, Any]:
    request = json.dumps(_request(case, options, mode, workers))
    proc = subprocess.run([sys.executable, "-m", "ejk.bench._tuning_study", request], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the tuning interpreter exited with {proc.returncode}: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run_tuning(cases: Iterable[Case], options: Options | None = None, workers: Sequence[int] = (1, 4), *,
               fresh_process: bool = True,
               on_measurement: Callable[[Measurement], None] | None = None,
               on_group: Callable[[list[Measurement]], None] | None = None) -> list[Measurement]:
    """Measure the tuning study (see the module) on every case, one line per ``workers`` setting."""
    options = options or Options()
    tune = _in_fresh_interpreter if fresh_process else tune_once
    results: list[Measurement] = []
    for case in cases:
        workload = workload_for(case, options.dtype)
        for mode in (m for m in options.modes if m in workload.modes):
            group = []
            for count in workers:
                base = Measurement(op=workload.op, case=case.label, series=case.series, x=case.x,
                                   mode=f"tuning {mode}", name=f"autotune, compile_workers={count}", kind="tuning",
                                   status="skipped")
                try:
                    found = tune(case, options, mode, count)
                except Exception as exc:
                    status, text = _failure("tuning", exc)
                    measured = attrs.evolve(base, status=status, error=text)
                else:
                    per = found["compile_s_per_candidate"]
                    note = found["describe"] + ("" if per is None else f"; {per:.2f} s compile per candidate")
                    measured = attrs.evolve(base, status="ok", median_s=found["wall_s"],
                                            compile_s=found["compile_wall_s"], config=found["best"],
                                            implementation=found["implementation"], note=note)
                if on_measurement is not None:
                    on_measurement(measured)
                group.append(measured)
            results += group
            if on_group is not None:
                on_group(group)
    return results


def _main(argv: Sequence[str]) -> None:
    print(json.dumps(tune_once(*_from_request(json.loads(argv[0])))))


if __name__ == "__main__":
    _main(sys.argv[1:])
