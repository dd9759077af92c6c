"""The emulated cluster: network namespaces on a bridge, links shaped with tc tbf.

Under CI (``LIGHTNING_FULLGRAPH_CI=1``) these tests fail, not skip, when the machine cannot make
namespaces: the benchmarks of time depend on them.
"""
import json
import os
import sys
import textwrap
import time

import pytest

from lightning_fullgraph.cluster import EmulatedCluster, cluster_support, parse_rate

# Timing: run alone, not beside other tests (scripts/test.sh).
pytestmark = pytest.mark.serial

WHY = cluster_support()
needs_cluster = pytest.mark.skipif(
    WHY is not None and os.environ.get("LIGHTNING_FULLGRAPH_CI") != "1",
    reason=f"no emulated cluster here: {WHY}")


def test_rates_are_read_as_tc_reads_them():
    assert parse_rate("1gbit") == 1e9 and parse_rate("100mbit") == 1e8
    assert parse_rate("2.5Gbit") == 2.5e9 and parse_rate("125mbps") == 1e9
    for bad in ("fast", "0gbit", "-1mbit", ""):
        with pytest.raises(ValueError, match="is not a positive rate like '1gbit'"):
            parse_rate(bad)


def test_a_dilated_cluster_emulates_one_core_machines():
    # Four one-core machines on 1 Gbit/s links, emulated on two cores: half a CPU and half
    # the link each, every time twice as long; with cores to spare, nothing changes.
    cluster = EmulatedCluster.dilated(4, "1gbit", cores=2)
    assert (cluster.dilation, cluster.cpus, cluster.rate_bits) == (2.0, 0.5, 5e8)
    cluster = EmulatedCluster.dilated(2, "1gbit", cores=8)
    assert (cluster.dilation, cluster.cpus, cluster.rate_bits) == (1.0, 1.0, 1e9)
    # Two-core machines: still half a CPU each, so every time runs four times as long.
    cluster = EmulatedCluster.dilated(4, "1gbit", cores=2, node_cores=2)
    assert (cluster.dilation, cluster.cpus, cluster.rate_bits, cluster.node_cores) == \
        (4.0, 0.5, 2.5e8, 2)
    cluster = EmulatedCluster.dilated(2, "1gbit", cores=8, node_cores=2)
    assert (cluster.dilation, cluster.cpus, cluster.rate_bits) == (1.0, 2.0, 1e9)
    with pytest.raises(ValueError, match="node_cores"):
        EmulatedCluster.dilated(2, "1gbit", node_cores=0)
    with pytest.raises(ValueError, match="cpus must be a positive number"):
        EmulatedCluster(2, "1gbit", cpus=0)


BUSY = "import os, time\nt = time.time()\nwhile time.time() - t < 1.5: pass\nprint(sum(os.times()[:2]))"


@needs_cluster
def test_a_node_is_held_to_its_cpus(tmp_path):
    import subprocess
    with EmulatedCluster(2, None, cpus=0.25) as cluster:
        procs = [cluster.popen(node, [sys.executable, "-c", BUSY], stdout=subprocess.PIPE,
                               text=True) for node in range(2)]
        assert cluster.wait(procs, timeout=60) == [0, 0]
        groups = list(cluster._cgroups)
        used = [float(p.stdout.read().strip()) for p in procs]
    # 1.5 s of wall clock at a quarter of a CPU (the interpreter's start-up included).
    assert all(0.2 < u < 0.6 for u in used), used
    assert not any(os.path.exists(g) for g in groups)  # removed with the cluster


# Two ranks time a 4 MiB all_to_all_single each way over gloo, bound to the node's interface.
ALL_TO_ALL = textwrap.dedent("""
    import json, os, sys, time, torch, torch.distributed as dist
    rank, master = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://{master}:29622", rank=rank, world_size=2)
    send = torch.zeros(2 * 2**20)  # 8 MiB: 4 MiB to each rank
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)  # warm-up
    dist.barrier()
    start = time.perf_counter()
    for _ in range(2):
        dist.all_to_all_single(recv, send)
    seconds = time.perf_counter() - start
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(dict(seconds=seconds)), flush=True)
""")


def _all_to_all_seconds(rate, tmp_path):
    script = tmp_path / "a2a.py"
    script.write_text(ALL_TO_ALL)
    import subprocess
    with EmulatedCluster(2, rate) as cluster:
        procs = [cluster.popen(node, [sys.executable, str(script), str(node), cluster.address(0)],
                               stdout=subprocess.PIPE, text=True) for node in range(2)]
        codes = cluster.wait(procs, timeout=120)
        out = procs[0].stdout.read()
    assert codes == [0, 0], codes
    return json.loads(out.strip().splitlines()[-1])["seconds"]


@needs_cluster
def test_the_shaping_is_visible_and_nothing_is_left_behind(tmp_path):
    import subprocess
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    shaped = _all_to_all_seconds("100mbit", tmp_path)
    unshaped = _all_to_all_seconds(None, tmp_path)
    # 2 x 4 MiB out of each node at 100 Mbit/s: at least 0.67 s; unshaped, a memory copy.
    assert shaped >= 0.6, shaped
    assert shaped > 5 * unshaped, (shaped, unshaped)
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert after == before


# A process that starts a child in a session of its own (as torchrun starts its workers) and
# prints the child's pid.
DETACHED = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(120)'], start_new_session=True); print(p.pid, flush=True); "
            "time.sleep(120)")


def _gone(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" in f.read()  # a zombie has ended
    except FileNotFoundError:
        return True


@needs_cluster
@pytest.mark.parametrize("cpus", [None, 0.5])
def test_down_ends_what_the_nodes_started_in_sessions_of_their_own(cpus):
    import subprocess
    with EmulatedCluster(2, None, cpus=cpus) as cluster:
        proc = cluster.popen(0, [sys.executable, "-c", DETACHED], stdout=subprocess.PIPE,
                             text=True)
        pid = int(proc.stdout.readline())
        assert not _gone(pid)
    for _ in range(50):  # the kernel ends it a moment after the signal
        if _gone(pid):
            break
        time.sleep(0.1)
    assert _gone(pid)


# Two ranks measure the planner's queue wait: a small all-reduce beside a bulk transfer of
# their own on another group (what the asynchronous pipeline does to the gradient all-reduce).
QUEUE_WAIT = textwrap.dedent("""
    import json, sys, torch.distributed as dist
    from lightning_fullgraph.planner import calibrate_queue_wait
    rank, master, beta = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    dist.init_process_group("gloo", init_method=f"tcp://{master}:29623", rank=rank, world_size=2)
    wait = calibrate_queue_wait(beta=beta)
    dist.destroy_process_group()
    print(json.dumps(dict(wait=wait)), flush=True)
""")


def _queue_wait(rate, tmp_path):
    script = tmp_path / "queue_wait.py"
    script.write_text(QUEUE_WAIT)
    import subprocess
    beta = parse_rate(rate) / 8 if rate else 1e9
    extra = dict(PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with EmulatedCluster(2, rate) as cluster:
        procs = [cluster.popen(node, [sys.executable, str(script), str(node), cluster.address(0),
                                      str(beta)], stdout=subprocess.PIPE, text=True, env=extra)
                 for node in range(2)]
        codes = cluster.wait(procs, timeout=120)
        outs = [p.stdout.read() for p in procs]
    assert codes == [0, 0], codes
    waits = [json.loads(out.strip().splitlines()[-1])["wait"] for out in outs]
    assert waits[0] == waits[1]  # all-reduced: every rank predicts the same step
    return waits[0]


@needs_cluster
def test_a_collective_queues_behind_a_transfer_on_a_shaped_link(tmp_path):
    # The link's queue holds what the transfer sent ahead: on a shaped link every message of
    # the all-reduce waits behind it; on an unshaped one the transfer does not queue.
    shaped = _queue_wait("10mbit", tmp_path)  # 0.17 and 0.45 s in two runs here
    unshaped = _queue_wait(None, tmp_path)
    assert shaped > 0.05, shaped
    assert shaped > 5 * unshaped, (shaped, unshaped)


@needs_cluster
def test_a_two_node_job_trains_and_sends_the_planned_bytes(tmp_path):
    import subprocess
    env = dict(PYTHONPATH=str(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
               OMP_NUM_THREADS="1")
    args = ["-m", "lightning_fullgraph.cli", "train", "--dataset", "cora", "--epochs", "3",
            "--num-nodes", "2", "--devices", "1", "--aggregation", "post", "--json",
            "--timeout", "120", "--cache-dir", str(tmp_path / "partitions")]
    with EmulatedCluster(2, "1gbit") as cluster:
        procs = cluster.torchrun(args, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        codes = cluster.wait(procs, timeout=600)
        out, err = procs[0].stdout.read(), procs[0].stderr.read()
    assert codes == [0, 0], (codes, err[-3000:])
    summary = json.loads(out[out.index("{"):])
    assert summary["processes"] == 2 and summary["test_acc"] > 0.2
    measured = summary["comm_MB_per_epoch_per_rank"]
    assert measured > 0
    assert measured == pytest.approx(summary["comm_MB_predicted_per_epoch_per_rank"], rel=1e-9)
