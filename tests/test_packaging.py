"""Packaging and installation: what a built wheel or sdist contains and does, the C++ kernels'
first-use build, scripts/install.sh's skipping, and CI's strictness about optional pieces."""
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import types
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# What setuptools needs to build the package (pyproject's readme included).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "lightning_fullgraph", "csrc")
BUILD_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info", "build", "dist")


def _child_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LIGHTNING_FULLGRAPH_CI", "LIGHTNING_FULLGRAPH_NO_EXT", "PYTHONPATH")}
    env.update(extra)
    return env


def _run(cmd, cwd, env=None, timeout=600):
    proc = subprocess.run(cmd, cwd=cwd, env=env or _child_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def _source_copy(tmp_path):
    """The build inputs copied out of the checkout: no stale build/ or egg-info of its own."""
    src = tmp_path / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=BUILD_IGNORE)
        else:
            shutil.copy2(path, src / name)
    return src


def _build_wheel(src, dist):
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--quiet", "-w", str(dist), str(src)], cwd=src)
    wheels = list(dist.glob("lightning_fullgraph-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _requirements(metadata):
    """``{name: [(specifier, marker), ...]}`` from a METADATA text."""
    reqs = {}
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            req, _, marker = line[len("Requires-Dist:"):].strip().partition(";")
            name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0)
            key = re.sub(r"[-_.]+", "-", name).lower()
            reqs.setdefault(key, []).append((req[len(name):].strip(), marker.strip()))
    return reqs


# Runs from the installed wheel, outside the checkout.
WHEEL_CHECK = r"""
import json, torch
import lightning_fullgraph
import lightning_fullgraph.kernels as K
from lightning_fullgraph.kernels import cpp
from lightning_fullgraph.data import load_cora
from lightning_fullgraph.data.cora import CORA_RAW_DIR

report = {"package": lightning_fullgraph.__file__, "source_dir": str(cpp.source_dir()),
          "cpp_available": K.cpp_available(), "cora_dir": CORA_RAW_DIR}
if report["cpp_available"]:
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 60, (2, 500), generator=g)
    x = torch.randn(60, 24, generator=g)
    w = torch.rand(500, generator=g) + 0.5
    for reduce in ("sum", "mean", "max"):
        torch.testing.assert_close(K.aggregate(x, ei, w, reduce, 60, backend="cpp"),
                                   K.aggregate(x, ei, w, reduce, 60, backend="torch"))
    report["cpp_matches_torch"] = True
data = load_cora()
report["cora"] = [data.num_nodes, data.edge_index.size(1), int(data.train_mask.sum())]
print("REPORT " + json.dumps(report))
"""


@pytest.mark.slow
def test_wheel_ships_the_kernel_sources_and_the_data(tmp_path):
    from lightning_fullgraph.kernels import cpp

    wheel = _build_wheel(_source_copy(tmp_path), tmp_path / "dist")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    csrc = {p.name for p in (ROOT / "csrc").iterdir() if p.suffix in (".cpp", ".h")}
    assert {f"lightning_fullgraph/kernels/csrc/{n}" for n in csrc} <= names
    assert not any(n.startswith("csrc/") for n in names)  # inside the package, not top-level
    assert "lightning_fullgraph/data/cora/raw/ind.cora.graph" in names
    assert re.search(r"^lightning-fullgraph = lightning_fullgraph\.cli:main$", entry_points, re.M)
    # `lightning` is Lightning's own command (Lightning <= 2.4 installs it): not taken here.
    assert not re.search(r"^lightning\s*=", entry_points, re.M)

    # Declared dependencies: scipy (PyG's Planetoid reader), the lowest tested releases of the
    # packages whose internals are used (newer ones install and warn: compat.require).
    reqs = _requirements(metadata)
    assert "scipy" in reqs
    assert all("<" not in spec for spec, _ in reqs["torch"])  # a GPU user's torch is kept
    for name, lower in (("torch-geometric", ">=2.7"), ("lightning", ">=2.5"),
                        ("pymetis", ">=2025.1")):
        assert any(lower in spec and "<" not in spec for spec, marker in reqs[name]
                   if not marker), (name, reqs[name])
    assert any('extra == "test"' in marker for _, marker in reqs["psutil"])

    site = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(site),
          str(wheel)], cwd=tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    # The default extension cache: the build directory is keyed by the sources' contents, so
    # the wheel reuses the build of the checkout (same sources) instead of compiling again.
    proc = _run([sys.executable, "-c", WHEEL_CHECK], cwd=outside,
                env=_child_env(PYTHONPATH=str(site)))
    report = json.loads(proc.stdout.split("REPORT ", 1)[1])

    assert Path(report["package"]).resolve().is_relative_to(site.resolve())
    assert Path(report["source_dir"]).resolve().is_relative_to(site.resolve())
    assert Path(report["cora_dir"]).resolve().is_relative_to(site.resolve())
    assert report["cora"] == [2708, 10556, 140]
    if report["cpp_available"] or os.environ.get("LIGHTNING_FULLGRAPH_CI") or cpp.load() is not None:
        # The checkout's extension builds here, so the wheel's must too.
        assert report["cpp_available"], proc.stderr[-3000:]
        assert report["cpp_matches_torch"]


@pytest.mark.slow
def test_sdist_carries_csrc_into_its_wheel(tmp_path):
    src = _source_copy(tmp_path)
    dist = tmp_path / "sdist"
    proc = _run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                 "print(b.build_sdist(sys.argv[1]))", str(dist)], cwd=src)
    sdist = dist / proc.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
        top = names[0].split("/")[0]
        assert f"{top}/csrc/aggregate.cpp" in names
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tf.extractall(tmp_path / "unpacked", filter="data")
        else:
            tf.extractall(tmp_path / "unpacked")
    wheel = _build_wheel(tmp_path / "unpacked" / top, tmp_path / "dist")
    with zipfile.ZipFile(wheel) as zf:
        assert "lightning_fullgraph/kernels/csrc/aggregate.cpp" in zf.namelist()


# ---------------------------------------------------------------------------------------------
# The C++ kernels' first-use build (torch's compiler call replaced: no real compilation here).

@pytest.fixture
def fake_build(monkeypatch, tmp_path):
    """``cpp`` reset to "not loaded yet", compiling into an empty cache with a fake compiler."""
    from torch.utils import cpp_extension

    from lightning_fullgraph.kernels import cpp

    monkeypatch.setattr(cpp, "_module", None)
    monkeypatch.setattr(cpp, "_failed", False)
    monkeypatch.setenv("LIGHTNING_FULLGRAPH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LIGHTNING_FULLGRAPH_EXT_DIR", raising=False)
    monkeypatch.delenv("LIGHTNING_FULLGRAPH_NO_EXT", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    calls = []

    def load(name, sources, build_directory, **kwargs):
        calls.append({"sources": list(sources), "build_directory": build_directory})
        Path(build_directory, f"{name}.so").write_bytes(b"")  # what a real build leaves
        return types.ModuleType(name)

    monkeypatch.setattr(cpp_extension, "load", load)

    def reload():
        monkeypatch.setattr(cpp, "_module", None)  # as in a new process
        return cpp.load()

    return types.SimpleNamespace(cpp=cpp, calls=calls, reload=reload)


def test_compiling_prints_one_line_and_the_time(fake_build, capsys):
    assert fake_build.reload() is not None
    err = capsys.readouterr().err
    bdir = fake_build.calls[0]["build_directory"]
    assert ("lightning-fullgraph: compiling the C++ aggregation kernels for this CPU "
            f"(first use, about a minute) into {bdir} ...") in err
    assert re.search(r"compiled in \d+ s", err)
    assert fake_build.reload() is not None  # cached library: loaded silently
    assert capsys.readouterr().err == ""
    assert len(fake_build.calls) == 2


def test_compile_message_only_on_local_rank_zero(fake_build, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert fake_build.reload() is not None
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LIGHTNING_FULLGRAPH_CACHE", str(tmp_path / "other-cache"))
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert fake_build.reload() is not None
    assert "compiling the C++ aggregation kernels" in capsys.readouterr().err


def test_checkout_and_installed_copies_share_one_build(fake_build, monkeypatch, tmp_path):
    # ninja rebuilds when the compile command (which names the source file) changes: both
    # locations must compile the same path, the copy inside the content-keyed build dir.
    cpp = fake_build.cpp
    assert cpp.source_dir() == ROOT / "csrc"  # a source checkout compiles its csrc/
    seen = []
    for where in ("checkout", "site-packages"):
        copy = tmp_path / where / "csrc"
        shutil.copytree(ROOT / "csrc", copy)
        monkeypatch.setattr(cpp, "source_dir", lambda sources=None, copy=copy: copy)
        assert fake_build.reload() is not None
        call = fake_build.calls[-1]
        seen.append((call["build_directory"], call["sources"]))
        for path in call["sources"]:
            assert Path(path).resolve().is_relative_to(Path(call["build_directory"]).resolve())
            assert Path(path).read_bytes() == (ROOT / "csrc" / Path(path).name).read_bytes()
    assert seen[0] == seen[1]


# ---------------------------------------------------------------------------------------------
# scripts/install.sh, with a fake environment whose pip only records its arguments.

def _fake_venv(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "pip.log"
    log.write_text("")
    python = venv / "bin" / "python"
    python.write_text(f'#!/usr/bin/env bash\n'
                      f'if [ "$1" = -m ] && [ "$2" = pip ]; then shift 2; echo "pip $*" >> "{log}"; exit 0; fi\n'
                      f'exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return venv, log


def _install(venv, extras):
    env = _child_env(LIGHTNING_FULLGRAPH_VENV=str(venv), EXTRAS=extras)
    return _run(["bash", str(ROOT / "scripts/install.sh")], cwd=ROOT, env=env, timeout=300).stderr


@pytest.mark.slow
def test_install_script_skips_what_is_done(tmp_path):
    # The fake environment runs this interpreter, which has lightning-fullgraph installed
    # editable from this checkout (scripts/test.sh did it) - with torch, which is kept.
    venv, log = _fake_venv(tmp_path)
    err = _install(venv, "test")
    pips = log.read_text().splitlines()
    assert "[setup] keeping the installed torch" in err
    assert not any("torch==" in line for line in pips)
    assert pips[-1] == "pip install --quiet --no-build-isolation -e .[test]"
    assert (venv / ".lightning-fullgraph-setup").is_file()

    err = _install(venv, "test")
    assert "[setup] up to date" in err
    assert len(log.read_text().splitlines()) == len(pips)  # pip not called

    err = _install(venv, "fabric")  # a new extra: installed with the earlier ones kept
    assert log.read_text().splitlines()[-1] == "pip install --quiet --no-build-isolation -e .[fabric,test]"
    err = _install(venv, "")  # fewer extras than installed: nothing to do
    assert "[setup] up to date (" in err and "extras: fabric,test" in err


# ---------------------------------------------------------------------------------------------
# CI: missing optional pieces fail instead of skipping.

def test_ci_runs_the_readme_test_command_strictly():
    lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
             if line.strip() and not line.strip().startswith("#")]
    assert "export LIGHTNING_FULLGRAPH_CI=1" in lines and "bash scripts/test.sh" in lines
    assert lines.index("export LIGHTNING_FULLGRAPH_CI=1") < lines.index("bash scripts/test.sh")


def _pytest(tmp_path, args, **env):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(ROOT), *args], cwd=ROOT, env=_child_env(**env),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("ci", ["", "1"])
def test_missing_optional_pieces_skip_locally_and_fail_in_ci(tmp_path, ci):
    # The C++ extension cannot build (its cache directory cannot be created) and triton is
    # not importable (a stand-in package raising what a missing one raises).
    blocker = tmp_path / "blocker" / "triton"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'triton'\", name='triton')\n")
    proc = _pytest(tmp_path, ["--continue-on-collection-errors",
                              "tests/kernels/test_aggregate.py::test_float64_cpp",
                              "tests/kernels/test_triton.py"],
                   LIGHTNING_FULLGRAPH_CACHE="/dev/null/cache", PYTHONPATH=str(blocker.parent),
                   LIGHTNING_FULLGRAPH_CI=ci)
    out = proc.stdout + proc.stderr
    if ci:
        assert proc.returncode == 1 and re.search(r"\b1 failed, .*1 error", out), out[-3000:]
        assert "FAILED tests/kernels/test_aggregate.py::test_float64_cpp" in out
        assert "ERROR tests/kernels/test_triton.py" in out
        assert out.count("not allowed with LIGHTNING_FULLGRAPH_CI=1") >= 2
    else:
        assert proc.returncode == 0 and re.search(r"\b2 skipped\b", out), out[-3000:]
        assert not re.search(r"\b\d+ (failed|errors?)\b", out), out[-3000:]


def test_launch_tests_find_console_scripts_beside_the_interpreter(monkeypatch):
    # `.venv/bin/python -m pytest` runs without the environment's bin/ on PATH.
    from tests.launch.test_launchers import _console_script

    monkeypatch.setenv("PATH", "/nonexistent")
    beside = Path(sys.executable).parent / "fabric"
    assert beside.is_file()  # Lightning installs the `fabric` script
    assert _console_script("fabric") == str(beside)
