"""The build lock's note: said when another process compiles, not when it only loads."""
import threading
import time

import pytest

from lightning_fullgraph.kernels import cpp

fcntl = pytest.importorskip("fcntl", reason="the flock-based build lock is POSIX only")


def _build_while_locked(tmp_path, monkeypatch, built: bool) -> str:
    # build_extension with everything but the lock stood in for: the library already in the
    # build directory (every run after the first) or not (a first run compiling).
    bdir = tmp_path / "build"
    bdir.mkdir()
    if built:
        (bdir / "k.so").write_bytes(b"")
    monkeypatch.setattr(cpp, "source_dir", lambda sources: tmp_path)
    monkeypatch.setattr(cpp, "build_dir", lambda src, sources: bdir)
    monkeypatch.setattr(cpp, "_stage_sources", lambda src, bdir, sources: [])
    from torch.utils import cpp_extension
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: "module")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    held, release = threading.Event(), threading.Event()

    def other_process():  # a separate open file description: flock excludes it
        with open(bdir / ".build.flock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            held.set()
            release.wait(5)
            fcntl.flock(fh, fcntl.LOCK_UN)

    thread = threading.Thread(target=other_process)
    thread.start()
    held.wait(5)
    threading.Timer(0.2, release.set).start()
    start = time.perf_counter()
    assert cpp.build_extension("k", ["k.cpp"], [], "test kernels") == "module"
    assert time.perf_counter() - start >= 0.1  # it did wait for the other process
    thread.join()
    return bdir


def test_waiting_for_a_process_that_only_loads_the_library_is_silent(tmp_path, monkeypatch,
                                                                     capsys):
    # Every run on several processes: the ranks load the built library one after the other.
    _build_while_locked(tmp_path, monkeypatch, built=True)
    assert capsys.readouterr().err == ""


def test_waiting_for_a_process_that_compiles_is_said(tmp_path, monkeypatch, capsys):
    bdir = _build_while_locked(tmp_path, monkeypatch, built=False)
    assert f"waiting for another process building in {bdir}" in capsys.readouterr().err
