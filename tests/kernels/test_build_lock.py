"""The extension build lock: a build killed mid-compile never makes later loads wait forever."""
import threading
import time

import pytest

from lightning_fullgraph.kernels import cpp

fcntl = pytest.importorskip("fcntl", reason="the flock-based build lock is POSIX only")


def test_stale_torch_lock_file_is_removed(tmp_path, capsys):
    # torch.utils.cpp_extension waits for `lock` to disappear; a killed build leaves it.
    (tmp_path / "lock").write_text("")
    with cpp._build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()
    assert "stale build lock" in capsys.readouterr().err


def test_second_builder_waits_for_the_first(tmp_path):
    order = []
    held = threading.Event()

    def first():
        with cpp._build_lock(tmp_path):
            held.set()
            time.sleep(0.3)
            order.append("first done")

    thread = threading.Thread(target=first)
    thread.start()
    held.wait(5)
    # A separate open file description: flock excludes it even within one process.
    with cpp._build_lock(tmp_path):
        order.append("second in")
    thread.join()
    assert order == ["first done", "second in"]


def test_lock_released_when_the_holder_raises(tmp_path):
    with pytest.raises(RuntimeError):
        with cpp._build_lock(tmp_path):
            raise RuntimeError("compile error")
    with open(tmp_path / ".build.flock") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
