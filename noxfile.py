"""Sessions of the ejk monorepo. `nox` runs the default ones: lint, typecheck, tests, the example plugin, build, docs.

Each test session installs only what it tests, from the checkout (no editable installs), so
the packaging is tested too. The `gpu` and `bench` sessions are not run by default.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import zipfile

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = ["lint", "typecheck", "tests_core", "tests_plugin", "integration", "example_plugin", "build",
                        "docs", "llm_example"]

PYTHON = "3.11"
ROOT = pathlib.Path(__file__).parent
PLUGINS = ["xla", "pallas", "triton", "cute"]
EXAMPLE = "examples/ejk-example-plugin"
TEST_DEPS = ["pytest>=8", "pytest-xdist>=3.2", "pydantic>=2", "hypothesis>=6", "pip", "hatchling>=1.18", "editables"]
#: pytest workers per session: CI machines have 2 cores (EJK_TEST_WORKERS overrides; 0 = in-process). They
#: steal queued tests from each other, so that a few long tests do not leave one worker idle at the end.
WORKERS = os.environ.get("EJK_TEST_WORKERS", "2")
# Per plugin: extra requirements and environment of its test session. ejk-triton's tests run the
# real kernels through Triton's interpreter (EJK_TRITON_INTERPRET=1, read before triton is
# imported); triton 3.6's interpreter breaks on numpy 2.4 for runtime loop bounds. ejk-pallas's tests
# run its GPU kernels in Pallas's interpret mode (EJK_PALLAS_INTERPRET=1). ejk-cute's tests compile
# every CuTe kernel config for Hopper on the CPU (jax.export for CUDA); the DSL reads the target from
# CUTE_DSL_ARCH when there is no GPU.
PLUGIN_TEST_DEPS = {"triton": ["numpy<2.4", "triton>=3.6,<3.7"], "cute": ["nvidia-cutlass-dsl==4.8.1"]}
PLUGIN_TEST_ENV = {"triton": {"EJK_TRITON_INTERPRET": "1"}, "pallas": {"EJK_PALLAS_INTERPRET": "1"},
                   "cute": {"CUTE_DSL_ARCH": "sm_90a"}}


def _pytest(session: nox.Session, *paths: str, env: dict[str, str] | None = None) -> None:
    args = [*paths, *session.posargs] if session.posargs else list(paths)
    workers = ["-n", WORKERS, "--dist", "worksteal"] if WORKERS != "0" else []
    session.run("python", "-m", "pytest", "-q", "--durations=15", *workers, *args,
                env={"JAX_PLATFORMS": "cpu", **(env or {})})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Ruff over every distribution, the tests and the benchmarks; the import rules (ejk-core layered
    without cycles, no private ejk import outside it: tools/check_imports.py) and their tests."""
    session.install("ruff>=0.6", "pytest>=8")
    session.run("ruff", "check", ".")
    session.run("python", "tools/check_imports.py")
    session.run("python", "-m", "pytest", "-q", "tools")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy (strict, unused ignores reported) over every distribution's sources (toolkits need not be installed)."""
    session.install("mypy>=1.10", "./core")
    session.run("mypy")


@nox.session(python=PYTHON)
def tests_core(session: nox.Session) -> None:
    """ejk-core alone: its tests, asserting that no plugin is discovered."""
    session.install(*TEST_DEPS, "./core[plot]")  # the plot extra: `ejk bench` writes its PNGs in the tests
    _pytest(session, "core/tests", env={"EJK_EXPECT_NO_PLUGINS": "1"})


@nox.session(python=PYTHON)
@nox.parametrize("plugin", PLUGINS)
def tests_plugin(session: nox.Session, plugin: str) -> None:
    """ejk-core plus one plugin: that plugin's tests."""
    session.install(*TEST_DEPS, *PLUGIN_TEST_DEPS.get(plugin, []), "./core", f"./plugins/ejk_{plugin}")
    env = {"EJK_EXPECT_PLUGINS": plugin, **PLUGIN_TEST_ENV.get(plugin, {})}
    _pytest(session, f"plugins/ejk_{plugin}/tests", env=env)


@nox.session(python=PYTHON)
def integration(session: nox.Session) -> None:
    """Every distribution installed together: cross-distribution tests, ops end to end, the CLI."""
    session.install(*TEST_DEPS, "./core[plot]", *(f"./plugins/ejk_{p}" for p in PLUGINS))
    _pytest(session, "tests", env={"EJK_EXPECT_PLUGINS": ",".join(PLUGINS)})
    # ejk-pallas's Mosaic varlen takes its gradients from another distribution's varlen implementation when
    # its config's backward is not the Mosaic one: that case needs them installed, so it runs here.
    _pytest(session, "plugins/ejk_pallas/tests/test_flash_attention_mgpu_segments.py", "-k", "varlen_values_and_grads",
            env=PLUGIN_TEST_ENV["pallas"])
    session.run("ejk", "demo", "--size", "tiny", "--cache-dir", str(pathlib.Path(session.create_tmp()) / "cache"))


def _kernels(session: nox.Session) -> list[dict[str, object]]:
    """`ejk kernels --json` of the session's environment."""
    out = session.run("ejk", "kernels", "--json", silent=True)
    return json.loads(str(out)) if out else []


@nox.session(python=PYTHON)
def example_plugin(session: nox.Session) -> None:
    """A third party's path: build the example plugin's wheel, install it next to ejk-core alone, see its
    implementations in `ejk kernels` and run its tests (conformance through ejk.testing, its op through the
    public ways, its ejk_choose_config policy, an explicit cfg= winning); then write a plugin with
    `ejk new-plugin`, install it and run its generated tests (and ruff with its generated settings)."""
    tmp = pathlib.Path(session.create_tmp())
    dist = tmp / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.install("uv")
    session.run("uv", "build", "--wheel", "--out-dir", str(dist), EXAMPLE)
    (wheel,) = dist.glob("ejk_example_plugin-*.whl")
    session.install(*TEST_DEPS, "ruff>=0.6", "./core", str(wheel))
    ours = {(r["algorithm"], r["name"]) for r in _kernels(session) if str(r["plugin"]).startswith("example ")}
    if ours != {("example_rms_norm", "fused"), ("matmul", "split_k")}:
        session.error(f"`ejk kernels` shows {sorted(ours)} from the example plugin")
    _pytest(session, f"{EXAMPLE}/tests")

    generated = tmp / "generated"
    shutil.rmtree(generated, ignore_errors=True)
    session.run("ejk", "new-plugin", "nox_demo", "--dir", str(generated))
    root = generated / "ejk-nox-demo"
    session.install(str(root))
    if not any(r["algorithm"] == "nox_demo_softcap" for r in _kernels(session)):
        session.error("`ejk kernels` does not show the generated plugin's nox_demo_softcap")
    with session.chdir(root):  # its own ruff settings; .nox is git-ignored here, not there
        session.run("ruff", "check", "--no-cache", "--no-respect-gitignore", ".")
    _pytest(session, str(root / "tests"))


@nox.session(python=PYTHON)
def llm_example(session: nox.Session) -> None:
    """examples/llm (a decoder trained and served on ejk, with a plain-JAX switch) installed next to ejk-core
    and ejk-xla: its tiny presets through both scripts, then its tests (backends agree, paged generation
    equals a dense-cache decode, steps on 4 and 8 CPU devices equal those on 1)."""
    session.install(*TEST_DEPS, "./core", "./plugins/ejk_xla", "./examples/llm")
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_backend_optimization_level=0"}  # smoke runs: compile fast
    session.run("python", "examples/llm/train.py", "--preset", "tiny", "--steps", "20", "--log-every", "5", env=env)
    session.run("python", "examples/llm/generate.py", "--preset", "tiny", "--tokens", "32", env=env)
    _pytest(session, "examples/llm/tests")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The documentation site (mkdocs.yml, docs/), built with --strict: a broken internal link or a page
    missing from the navigation fails it."""
    session.install("mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10")
    site = pathlib.Path(session.create_tmp()) / "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site), env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(python=False)
def gpu(session: nox.Session) -> None:
    """Every GPU-marked test of every distribution in the current environment, on a machine with an NVIDIA GPU
    (tools/gpu_tests.sh: per-test time limits, workers sharing the GPU; arguments go to pytest)."""
    session.run("bash", "tools/gpu_tests.sh", *session.posargs, external=True)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The overhead study of `ejk bench` on the CPU: import times, and what the public ops add to a call of
    their implementations, under jax.jit and eagerly, on tiny inputs (arguments after -- go to `ejk bench`)."""
    session.install("./core", *(f"./plugins/ejk_{p}" for p in PLUGINS))
    out = pathlib.Path(session.create_tmp()) / "bench-overhead"
    session.run("ejk", "bench", "--overhead", "--shapes", "matmul:8x8x8;attention:1x16x2x8", "--no-plot",
                "--out", str(out), *session.posargs, env={"JAX_PLATFORMS": "cpu"})


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Wheels and sdists of every distribution; each plugin wheel must declare its `ejk` entry point."""
    session.install("build>=1", "uv")
    out = pathlib.Path(session.create_tmp()) / "dist"
    for path in ["core", *(f"plugins/ejk_{p}" for p in PLUGINS)]:
        session.run("uv", "build", "--out-dir", str(out), path)
    wheels = sorted(out.glob("*.whl"))
    session.log("built: " + ", ".join(w.name for w in wheels))
    for plugin in PLUGINS:
        (wheel,) = [w for w in wheels if w.name.startswith(f"ejk_{plugin}-")]
        with zipfile.ZipFile(wheel) as zf:
            name = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
            text = zf.read(name).decode()
        expected = f"{plugin} = ejk_{plugin}.plugin"
        if "[ejk]" not in text or expected not in text:
            session.error(f"{wheel.name} lacks the entry point `[ejk] {expected}`:\n{text}")
        if not any(n.endswith("py.typed") for n in zipfile.ZipFile(wheel).namelist()):
            session.error(f"{wheel.name} lacks py.typed")
    if os.environ.get("EJK_KEEP_DIST"):
        session.log(f"wheels kept in {out}")
