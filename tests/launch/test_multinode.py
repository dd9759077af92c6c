"""A real two-node job on localhost: two launchers of one training script, each with
``MASTER_ADDR``, ``MASTER_PORT`` and ``NODE_RANK`` as a user sets them on two machines, and
``Trainer(devices=2, num_nodes=2)``; Lightning starts each node's second process itself.

The job is launched once per module (``multinode_script.py``); the tests check what it did:
every rank finished with Lightning's host-major numbering, the partition is host-aware, the
engine counts bytes to the other host apart (and they match the partition's statistics),
and the trained model equals single-process PyG training.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ..environment import fresh_environment

psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("multinode_script.py")
EPOCHS = 5
NODES, DEVICES = 2, 2
WORLD = NODES * DEVICES
LIMIT_S = 240  # the whole job, start-up included; a hang fails here instead of blocking

def _env(node_rank, port, cache):
    env = fresh_environment()
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK=str(node_rank),
               TEST_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    return env


def _group_alive(pgid):
    r"""Processes of a process group that are still running (zombies do not count)."""
    alive = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return alive


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path, n=4000):
    try:
        return Path(path).read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _launch(workdir):
    r"""Runs the two nodes to their end; returns ``(results by global rank, logs)``.

    Each launcher gets a session of its own, so the node's processes (the launcher and the
    rank Lightning starts) form one process group: on failure or past :data:`LIMIT_S` both
    groups are killed, and the job counts as finished only when no process of either group
    is left.  Output goes to files, never to pipes nobody reads.
    """
    from lightning_fullgraph.testing import free_port
    out = workdir / "out"
    out.mkdir()
    port = free_port()
    nodes = []
    for node in range(NODES):
        d = workdir / f"node{node}"
        d.mkdir()
        stdout, stderr = open(d / "stdout.log", "w"), open(d / "stderr.log", "w")
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--epochs", str(EPOCHS), "--out", str(out),
             "--timeout", "60"],
            cwd=d, env=_env(node, port, d / "cache"), stdout=stdout, stderr=stderr,
            start_new_session=True)
        stdout.close()
        stderr.close()
        nodes.append((proc, d))

    def logs():
        return "\n".join(f"--- node {i} stdout\n{_tail(d / 'stdout.log', 2000)}\n"
                         f"--- node {i} stderr\n{_tail(d / 'stderr.log')}"
                         for i, (_, d) in enumerate(nodes))

    deadline = time.monotonic() + LIMIT_S
    failure = None
    try:
        while True:
            codes = [p.poll() for p, _ in nodes]
            if any(c not in (None, 0) for c in codes):
                failure = f"a launcher failed (exit codes {codes})"
                break
            if all(c == 0 for c in codes) and not any(_group_alive(p.pid) for p, _ in nodes):
                break  # both launchers and the ranks they started are gone
            if time.monotonic() > deadline:
                failure = f"the job did not finish within {LIMIT_S} s (exit codes {codes})"
                break
            time.sleep(0.25)
    finally:
        for p, _ in nodes:
            if failure is not None or p.poll() is None:
                _kill_group(p.pid)
        for p, _ in nodes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for p, _ in nodes:  # a rank whose launcher exited first must not outlive the test
            for q in _group_alive(p.pid):
                q.kill()
    if failure is not None:
        pytest.fail(f"{failure}\n{logs()}", pytrace=False)

    results = {}
    for _, d in nodes:
        for line in (d / "stdout.log").read_text().splitlines():
            if line.startswith("RESULT "):
                r = json.loads(line[len("RESULT "):])
                results[r["global_rank"]] = r
    assert sorted(results) == list(range(WORLD)), f"ranks that reported: {sorted(results)}\n" \
        + logs()
    return results, {i: d for i, (_, d) in enumerate(nodes)}, out


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("multinode"))


def _propagate_rows(per_key, direction):
    r"""For one epoch of one rank: {layer: (rows sent, rows sent to the other host)} over
    the halo exchanges (post and pre channels) of :obj:`direction`."""
    out = {}
    for name, c in per_key.items():
        key, d = name.rsplit("|", 1)
        if d != direction or ".propagate" not in key or not c["rows_sent"]:
            continue
        row_bytes, rest = divmod(c["bytes_sent"], c["rows_sent"])
        assert rest == 0 and c["inter_sent"] % row_bytes == 0, (name, c)
        layer = key.split(".")[0]
        rows, inter = out.get(layer, (0, 0))
        out[layer] = (rows + c["rows_sent"], inter + c["inter_sent"] // row_bytes)
    return out


@pytest.mark.multiprocess
@pytest.mark.slow
def test_every_rank_finishes_with_lightnings_numbering(job):
    results, _, _ = job
    for rank, r in results.items():
        assert r["world_size"] == WORLD and r["num_nodes"] == NODES
        # Host-major: what host-aware partitioning and the inter-host counters assume.
        assert rank == r["node_rank"] * DEVICES + r["local_rank"], r
        assert r["env_node_rank"] == str(r["node_rank"])
        assert r["ranks_per_host"] == DEVICES
        assert len(r["epochs"]) == EPOCHS
    # Two distinct processes per node (the launcher and the one Lightning started).
    assert len({r["pid"] for r in results.values()}) == WORLD


@pytest.mark.multiprocess
@pytest.mark.slow
def test_each_node_partitions_host_aware_into_its_own_cache(job):
    from lightning_fullgraph.partition import read_manifest
    results, nodes, _ = job
    manifests = {}
    for rank, r in results.items():
        d = Path(r["partition_dir"])
        # prepare_data runs on every node's local rank 0: each node reads its own copy.
        assert nodes[r["node_rank"]] / "cache" in d.parents, (rank, d)
        manifests[rank] = read_manifest(d)
    for m in manifests.values():
        assert m["options"]["hosts"] == NODES
        assert m["stats"]["hosts"] == NODES
        assert m["files"] == manifests[0]["files"]  # the same partition on both nodes
    assert sum(r["owned"] for r in results.values()) == 2708  # Cora's nodes, each once


@pytest.mark.multiprocess
@pytest.mark.slow
def test_inter_host_bytes_are_counted_apart(job):
    results, _, _ = job
    sent = {rank: sum(c["bytes_sent"] for e in r["epochs"] for c in e.values())
            for rank, r in results.items()}
    inter = {rank: sum(c["inter_sent"] for e in r["epochs"] for c in e.values())
             for rank, r in results.items()}
    for rank in results:
        assert 0 < inter[rank] < sent[rank], (rank, inter[rank], sent[rank])
    # What leaves one host arrives at the other.
    inter_received = sum(c["inter_received"] for r in results.values() for e in r["epochs"]
                         for c in e.values())
    assert sum(inter.values()) == inter_received
    # CommunicationMonitor logs the same figure (per rank and epoch, in MB).
    for r in results.values():
        expect = [sum(c["inter_sent"] for c in e.values()) / 1e6 for e in r["epochs"]]
        assert r["monitor_inter_host_sent_MB"] == pytest.approx(expect, rel=1e-12)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_measured_rows_match_the_partition_and_beat_flat_partitioning(job):
    # What the launch adds to tests/partition/test_hosts.py: the engine, with Lightning's
    # numbering across nodes, moves exactly the rows the host-aware partition's statistics
    # predict, so its smaller inter-host row count is smaller inter-host traffic.
    from lightning_fullgraph.data import load_cora
    from lightning_fullgraph.partition import (
        metis_partition, node_weights_for, partition_stats, read_manifest)
    results, _, _ = job
    stats = read_manifest(results[0]["partition_dir"])["stats"]
    hybrid, hybrid_inter = stats["mode_rows"]["hybrid"], stats["inter_host_rows"]["hybrid"]
    assert 0 < hybrid_inter < hybrid
    checked = 0
    for epoch in range(EPOCHS):
        for direction in ("forward", "backward"):
            per_rank = [_propagate_rows(results[r]["epochs"][epoch], direction)
                        for r in range(WORLD)]
            for layer in set().union(*per_rank):
                rows = sum(p.get(layer, (0, 0))[0] for p in per_rank)
                inter = sum(p.get(layer, (0, 0))[1] for p in per_rank)
                assert (rows, inter) == (hybrid, hybrid_inter), (epoch, direction, layer)
                checked += 1
    assert checked >= EPOCHS * 2  # at least one layer both ways every epoch

    data = load_cora()
    flat = metis_partition(data.edge_index, data.num_nodes, WORLD,
                           node_weights=node_weights_for(data))
    flat_stats = partition_stats(flat, data.edge_index, num_parts=WORLD, hosts=NODES)
    assert hybrid_inter < flat_stats.inter_host_rows["hybrid"]
    assert stats["inter_host_rows"]["post"] < flat_stats.inter_host_rows["post"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_trained_model_equals_single_process_pyg(job):
    import torch.nn.functional as F
    from lightning_fullgraph.data import load_cora
    from .multinode_script import Net
    _, _, out = job
    data = load_cora()
    torch.manual_seed(0)
    ref = Net(data.num_features, int(data.y.max()) + 1)
    opt = ref.configure_optimizers()
    for _ in range(EPOCHS):  # what Lightning's automatic optimization does, on one process
        opt.zero_grad()
        logits = ref(data.x, data.edge_index)
        F.cross_entropy(logits[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()
    expect = ref.state_dict()
    trained = [torch.load(out / f"params-rank{r}.pt", weights_only=True) for r in range(WORLD)]
    for r, params in enumerate(trained):
        assert params.keys() == expect.keys()
        for name, p in params.items():
            assert p.dtype == torch.float32
            assert torch.equal(p, trained[0][name]), (r, name)  # replicas agree exactly
            q = expect[name]
            assert not torch.equal(p, torch.zeros_like(p))
            err = float((p - q).abs().max() / q.abs().max())
            assert err < 1e-5, (r, name, err)
    # Training moved the parameters (the comparison is not of two initializations).
    torch.manual_seed(0)
    init = Net(data.num_features, int(data.y.max()) + 1).state_dict()
    assert float((expect["conv1.lin.weight"] - init["conv1.lin.weight"]).abs().max()) > 1e-3
