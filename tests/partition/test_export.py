"""export_partition: copies a partition without ever deleting what the library
did not write (the target of ``lightning-fullgraph partition --out DIR``)."""
import json
import os

import pytest
import torch

import lightning_fullgraph.partition.export as export
from lightning_fullgraph.partition import (
    ExportTargetError,
    PartitionError,
    PartitionFormatError,
    PartitionWriteError,
    export_partition,
    graph_fingerprint,
    load_partition,
    partition_graph,
)


@pytest.fixture
def source(tmp_path, graph):
    return graph, partition_graph(graph, 3, root=tmp_path / "cache", progress=False)


def assert_loads(path, data, num_parts=3):
    for r in range(num_parts):
        lp = load_partition(path, r, num_parts=num_parts, fingerprint=graph_fingerprint(data))
        assert torch.equal(lp.node_attrs["x"], data.x[lp.owned_ids])


def hidden(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def snapshot(directory):
    return {p.relative_to(directory).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(directory.rglob("*"))}


def test_public_api():
    import lightning_fullgraph.partition as partition
    assert "export_partition" in partition.__all__ and "export_partition" in export.__all__
    assert issubclass(ExportTargetError, (PartitionError, FileExistsError))
    assert issubclass(PartitionWriteError, (PartitionError, OSError))


def test_new_directory(tmp_path, source):
    data, src = source
    out = tmp_path / "exports" / "nested" / "parts"  # parents are created
    assert export_partition(src, out) == out
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json", "part-0-of-3.pt", "part-1-of-3.pt", "part-2-of-3.pt"]
    assert_loads(out, data)
    assert hidden(out.parent) == [] and hidden(out) == []
    assert_loads(src, data)  # the source is untouched


def test_relative_path_is_returned_absolute(tmp_path, source, monkeypatch):
    data, src = source
    monkeypatch.chdir(tmp_path)
    out = export_partition(src, "rel")
    assert out == tmp_path / "rel" and out.is_absolute()
    assert_loads(out, data)


def test_existing_empty_directory_is_filled(tmp_path, source):
    data, src = source
    out = tmp_path / "empty"
    out.mkdir()
    inode = out.stat().st_ino
    assert export_partition(src, out) == out
    assert out.stat().st_ino == inode  # filled in place, not replaced
    assert_loads(out, data)
    assert hidden(out) == [] and hidden(tmp_path) == []


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_existing_partition_directory_is_replaced(tmp_path, make_graph, source, exchange,
                                                  monkeypatch):
    data, src = source
    if not exchange:
        monkeypatch.setattr(export, "_rename_exchange", lambda a, b: False)
    out = tmp_path / "out"
    old_graph = make_graph(seed=5)
    export_partition(partition_graph(old_graph, 2, root=tmp_path / "c2", progress=False), out)
    assert_loads(out, old_graph, num_parts=2)
    assert export_partition(src, out) == out
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json", "part-0-of-3.pt", "part-1-of-3.pt", "part-2-of-3.pt"]
    assert_loads(out, data)
    assert hidden(tmp_path) == [] and hidden(out) == []  # old copy and temporaries gone


def test_rename_exchange_swaps_directories(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "f").write_text("a"), (b / "f").write_text("b")
    swapped = export._rename_exchange(a, b)
    # False only where the system lacks it (then nothing moved; the two-rename
    # fallback is tested by test_existing_partition_directory_is_replaced).
    expect = ("b", "a") if swapped else ("a", "b")
    assert ((a / "f").read_text(), (b / "f").read_text()) == expect


def test_partition_directory_with_a_foreign_file_is_refused(tmp_path, source):
    data, src = source
    out = export_partition(src, tmp_path / "out")
    (out / "notes.txt").write_text("my notes")
    before = snapshot(out)
    with pytest.raises(ExportTargetError) as info:
        export_partition(src, out)
    text = str(info.value)
    assert "'notes.txt'" in text and "did not write" in text
    assert "choose an empty or new directory" in text and "nothing was changed" in text
    assert snapshot(out) == before  # the user's file (and everything else) is still there
    assert hidden(tmp_path) == []


@pytest.mark.parametrize("content", ["file", "subdir", "symlink", "foreign-manifest",
                                     "only-part-files"])
def test_non_partition_directory_is_refused(tmp_path, source, content):
    _, src = source
    out = tmp_path / "mine"
    out.mkdir()
    if content == "file":
        (out / "thesis.tex").write_text("\\documentclass{article}")
        name = "thesis.tex"
    elif content == "subdir":
        (out / "manifest.json").write_bytes((src / "manifest.json").read_bytes())
        (out / "data").mkdir()
        (out / "data" / "keep.csv").write_text("1,2")
        name = "data"
    elif content == "symlink":
        (out / "manifest.json").write_bytes((src / "manifest.json").read_bytes())
        (out / "part-0-of-3.pt").symlink_to(src / "part-0-of-3.pt")
        name = "part-0-of-3.pt"
    elif content == "foreign-manifest":
        (out / "manifest.json").write_text(json.dumps({"name": "my web app"}))
        name = "manifest.json"
    else:  # part-like names but no manifest: not provably ours
        (out / "part-0-of-2.pt").write_bytes(b"user data")
        name = "part-0-of-2.pt"
    before = snapshot(out)
    with pytest.raises(ExportTargetError, match=f"holds '{name}'.*choose an empty or new "
                                                f"directory"):
        export_partition(src, out)
    assert snapshot(out) == before
    assert hidden(tmp_path) == []


def test_existing_file_is_refused(tmp_path, source):
    _, src = source
    out = tmp_path / "results.txt"
    out.write_text("precious")
    with pytest.raises(ExportTargetError, match="it is an existing file, not a directory; "
                                                "choose an empty or new directory"):
        export_partition(src, out)
    assert out.read_text() == "precious"


def test_target_inside_the_source_is_refused(source):
    _, src = source
    with pytest.raises(ExportTargetError, match="inside the partition directory"):
        export_partition(src, src / "copy")
    assert not (src / "copy").exists()


def test_export_onto_itself_verifies_and_keeps_it(source):
    data, src = source
    assert export_partition(src, src) == src
    assert_loads(src, data)


def test_symlink_to_empty_directory_is_filled_and_kept(tmp_path, source):
    data, src = source
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert export_partition(src, link) == link
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert_loads(real, data)


def test_corrupted_source_writes_nothing(tmp_path, source):
    _, src = source
    f = src / "part-1-of-3.pt"
    blob = bytearray(f.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    f.write_bytes(bytes(blob))
    with pytest.raises(PartitionFormatError, match="part-1-of-3.pt is corrupted"):
        export_partition(src, tmp_path / "out")
    assert not (tmp_path / "out").exists() and hidden(tmp_path) == []

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PartitionFormatError, match="part-1-of-3.pt is corrupted"):
        export_partition(src, empty)
    assert list(empty.iterdir()) == []  # what the failed export wrote is removed


def test_failure_while_replacing_keeps_the_old_partition(tmp_path, make_graph, source,
                                                         monkeypatch):
    _, src = source
    out = tmp_path / "out"
    old_graph = make_graph(seed=5)
    export_partition(partition_graph(old_graph, 2, root=tmp_path / "c2", progress=False), out)
    before = snapshot(out)
    calls = []
    real = export._copy_verified

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(export, "_copy_verified", failing)
    with pytest.raises(PartitionWriteError, match="no space left"):
        export_partition(src, out)
    assert snapshot(out) == before
    assert_loads(out, old_graph, num_parts=2)
    assert hidden(tmp_path) == []


def test_unwritable_target_is_a_clear_error(tmp_path, source, read_only):
    _, src = source
    read_only(tmp_path / "ro")
    with pytest.raises(PartitionWriteError) as info:
        export_partition(src, tmp_path / "ro" / "out")
    text = str(info.value)
    assert f"cannot export the partition to {tmp_path / 'ro' / 'out'}" in text
    assert "permission denied" in text and "choose a writable, empty or new directory" in text
    assert not (tmp_path / "ro").exists()


def test_missing_source_is_a_format_error(tmp_path):
    with pytest.raises(PartitionFormatError, match="no partition manifest"):
        export_partition(tmp_path / "nothing", tmp_path / "out")
    assert not (tmp_path / "out").exists()
