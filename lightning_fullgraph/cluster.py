r"""An emulated cluster on one Linux machine: network namespaces on a bridge, every node's
link shaped to a chosen rate, for tests and benchmarks of time.

Each "node" is a network namespace with one veth interface on a shared bridge and its own
address in a private subnet; its outgoing traffic is shaped by a token bucket filter (``tc qdisc
... tbf``) to :obj:`rate`, so what one node sends to the others crosses a link of that rate, as
between machines on a switch.  Processes are started inside a namespace (``ip netns exec``)
with ``GLOO_SOCKET_IFNAME`` naming its interface, so gloo's traffic takes the shaped link, and
one ``torchrun`` per node (:meth:`EmulatedCluster.torchrun`) makes a multi-node job out of them.
Only addresses inside the namespaces the cluster creates are used; everything it created is
removed when it closes (a context manager; also at interpreter exit and on SIGTERM/SIGINT).

Needs root (or ``CAP_NET_ADMIN``), ``ip`` and ``tc`` (iproute2) and the ``tbf`` qdisc; latency
cannot be added (that needs ``netem``), so the links have the bridge's latency (tens of µs).

The nodes share the machine's cores.  With :obj:`cpus` each node's processes are held to that
many CPUs by a cgroup CPU quota (v1 ``cpu`` or v2 ``cpu.max``): otherwise a rank blocked on
the link lends its core to the others, and a configuration that communicates more looks
cheaper than on machines of their own.  Holding N nodes to ``cores / N`` CPUs each and their
links to ``rate * cores / N`` emulates N one-core machines on links of ``rate`` with every
time stretched by ``N / cores`` (time dilation, Gupta et al., NSDI 2006): ratios of times are
those of the emulated cluster (:meth:`EmulatedCluster.dilated`)::

    with EmulatedCluster(nodes=4, rate="1gbit") as cluster:
        jobs = cluster.torchrun(["-m", "lightning_fullgraph.cli", "train", "--dataset", "cora"])
        codes = cluster.wait(jobs, timeout=600)

``python -m lightning_fullgraph.cluster --nodes 2 --rate 1gbit -- <command>`` runs one command
per node (``{node}``, ``{nodes}``, ``{master}`` in it are replaced) and tears everything down.
"""
import argparse
import atexit
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import weakref
from typing import Dict, List, Optional, Sequence

__all__ = ["EmulatedCluster", "ClusterUnavailable", "parse_rate", "cluster_support"]

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(bit|bps)?\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_OPEN: "weakref.WeakSet[EmulatedCluster]" = weakref.WeakSet()


class ClusterUnavailable(RuntimeError):
    r"""The machine cannot host an emulated cluster (no permission, no ``ip``/``tc``, no
    ``tbf``); the message says which and what would fix it."""


def parse_rate(rate: str) -> float:
    r"""Bits per second of a rate written as ``tc`` does (``"1gbit"``, ``"100mbit"``,
    ``"2.5gbit"``; ``"...bps"`` means bytes per second, as in ``tc``).

    Raises:
        ValueError: For anything else, naming the accepted forms.
    """
    match = _RATE.match(str(rate))
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"rate {rate!r} is not a positive rate like '1gbit', '100mbit' or "
                         "'125mbps' (bytes per second)")
    bits = float(match.group(1)) * _SCALE[match.group(2).lower()]
    return bits * 8 if (match.group(3) or "").lower() == "bps" else bits


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(list(argv), capture_output=True, text=True)
    if check and out.returncode != 0:
        raise ClusterUnavailable(f"`{' '.join(argv)}` failed: {out.stderr.strip() or out.stdout}")
    return out


def cluster_support() -> Optional[str]:
    r"""``None`` if an emulated cluster can be made here, else why not (with the fix)."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian/Ubuntu: apt-get install iproute2)"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return ("network namespaces need root (or CAP_NET_ADMIN): run as root, e.g. in a "
                "container started with --cap-add NET_ADMIN")
    probe = f"lfgprobe{secrets.token_hex(3)}"
    out = _run(["ip", "netns", "add", probe], check=False)
    if out.returncode != 0:
        return f"cannot create a network namespace: {out.stderr.strip()}"
    try:
        out = _run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root",
                    "tbf", "rate", "1gbit", "burst", "64kb", "latency", "100ms"], check=False)
        if out.returncode != 0:
            return f"the kernel has no tbf qdisc (sch_tbf): {out.stderr.strip()}"
    finally:
        _run(["ip", "netns", "delete", probe], check=False)
    return None


class EmulatedCluster:
    r""":obj:`nodes` network namespaces on one bridge, each node's outgoing link shaped to
    :obj:`rate`.

    Args:
        nodes (int): Number of nodes (namespaces), at least 1.
        rate (str, optional): Link rate per node and direction (``"1gbit"``); ``None`` for
            unshaped links (the bridge's own speed, for comparisons).
        burst (int, optional): Token bucket size in bytes (default: a 4 ms worth of the rate,
            at least 64 KiB: what a NIC sends back to back).
        cpus (float, optional): CPUs each node's processes may use together (a cgroup CPU
            quota, e.g. ``0.5``); ``None``: no limit.

    Attributes:
        name (str): A short random id in every interface and namespace name it creates.
    """

    def __init__(self, nodes: int, rate: Optional[str] = "1gbit",
                 burst: Optional[int] = None, cpus: Optional[float] = None) -> None:
        if int(nodes) < 1:
            raise ValueError(f"an emulated cluster needs at least 1 node, got {nodes}")
        if cpus is not None and not float(cpus) > 0:
            raise ValueError(f"cpus must be a positive number of CPUs per node, got {cpus!r}")
        self.nodes = int(nodes)
        self.cpus = float(cpus) if cpus is not None else None
        self._cgroups: List[str] = []
        self.rate = rate
        self.rate_bits = parse_rate(rate) if rate is not None else None
        if burst is None and self.rate_bits is not None:
            burst = max(64 * 1024, int(self.rate_bits / 8 * 0.004))
        self.burst = burst
        self.name = secrets.token_hex(2)
        # A /24 per cluster inside 10.213.0.0/16, chosen from the id: two clusters at once
        # (tests in parallel) get different subnets with high probability.
        self.subnet = int(self.name, 16) % 250 + 1
        self._created: List[List[str]] = []  # undo commands, run in reverse
        self._procs: List[subprocess.Popen] = []
        self._up = False

    @classmethod
    def dilated(cls, nodes: int, rate: str, cores: Optional[int] = None, node_cores: int = 1,
                **kwargs) -> "EmulatedCluster":
        r""":obj:`nodes` machines of :obj:`node_cores` cores on links of :obj:`rate`, emulated
        on :obj:`cores` cores (default: this machine's).  Each node gets ``min(node_cores,
        cores / nodes)`` CPUs; where that is fewer than :obj:`node_cores`, every time is
        stretched by :attr:`dilation` ``= node_cores / CPUs`` and the link slowed by as much,
        so ratios are kept.  Run ranks with :obj:`node_cores` threads
        (``OMP_NUM_THREADS``): the emulation assumes they use the cores as a machine's
        would (a thread count the node cannot run in parallel shares its quota).

        Args:
            nodes (int): Machines.
            rate (str): Their links' rate, e.g. ``"1gbit"``.
            cores (int, optional): This machine's cores to spread over the nodes.
            node_cores (int): Cores of each emulated machine. (default: :obj:`1`)
        """
        cores = int(cores or os.cpu_count() or 1)
        if int(node_cores) < 1:
            raise ValueError(f"node_cores must be at least 1, got {node_cores}")
        real = min(float(node_cores), cores / nodes)
        factor = max(1.0, node_cores / real)
        cluster = cls(nodes, f"{parse_rate(rate) / factor:.0f}bit", cpus=real, **kwargs)
        cluster.dilation = factor
        cluster.node_cores = int(node_cores)
        return cluster

    #: How much slower than the emulated cluster every time runs (see :meth:`dilated`).
    dilation: float = 1.0
    #: Cores of each emulated machine (see :meth:`dilated`; ``None``: not emulated).
    node_cores: Optional[int] = None

    # -- names ---------------------------------------------------------------------------------
    def namespace(self, node: int) -> str:
        return f"lfg{self.name}n{node}"

    def interface(self, node: int) -> str:
        r"""The node's interface inside its namespace (``GLOO_SOCKET_IFNAME``)."""
        return f"lfg{self.name}v{node}"

    def address(self, node: int) -> str:
        return f"10.213.{self.subnet}.{node + 1}"

    @property
    def bridge(self) -> str:
        return f"lfg{self.name}br"

    # -- life cycle ----------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedCluster":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> "EmulatedCluster":
        r"""Creates the bridge, the namespaces, their links and their shaping.

        Raises:
            ClusterUnavailable: When the machine cannot (nothing is left behind).
        """
        if self._up:
            return self
        why = cluster_support()
        if why is not None:
            raise ClusterUnavailable(f"no emulated cluster on this machine: {why}")
        _OPEN.add(self)
        _install_teardown()
        self._up = True
        try:
            self._do(["ip", "link", "add", self.bridge, "type", "bridge"],
                     ["ip", "link", "delete", self.bridge])
            self._do(["ip", "link", "set", self.bridge, "up"])
            for node in range(self.nodes):
                ns, inside, outside = self.namespace(node), self.interface(node), \
                    f"lfg{self.name}p{node}"
                self._do(["ip", "netns", "add", ns], ["ip", "netns", "delete", ns])
                self._do(["ip", "link", "add", inside, "type", "veth", "peer", "name", outside],
                         ["ip", "link", "delete", outside])
                self._do(["ip", "link", "set", outside, "master", self.bridge])
                self._do(["ip", "link", "set", outside, "up"])
                self._do(["ip", "link", "set", inside, "netns", ns])
                self._do(["ip", "netns", "exec", ns, "ip", "addr", "add",
                          f"{self.address(node)}/24", "dev", inside])
                self._do(["ip", "netns", "exec", ns, "ip", "link", "set", inside, "up"])
                self._do(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
                if self.cpus is not None:
                    self._cgroups.append(self._cpu_cgroup(node))
                if self.rate is not None:
                    # Queue up to a second of traffic rather than drop it: the shaping, not
                    # TCP's loss recovery, sets the time.
                    self._do(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", inside,
                              "root", "tbf", "rate", str(self.rate), "burst", str(self.burst),
                              "latency", "1000ms"])
        except BaseException:
            self.down()
            raise
        return self

    def _cpu_cgroup(self, node: int) -> str:
        r"""A cgroup holding :obj:`node`'s processes to :attr:`cpus` CPUs; its directory."""
        period = 10_000  # µs: a short period, so a rank is never held back for long at once
        quota = max(1_000, int(round(self.cpus * period)))
        path = os.path.join(_cpu_hierarchy(), f"lfg{self.name}n{node}")
        os.mkdir(path)
        self._created.append(["rmdir", path])
        if os.path.exists(os.path.join(path, "cpu.max")):  # cgroup v2
            _write(os.path.join(path, "cpu.max"), f"{quota} {period}")
        else:
            _write(os.path.join(path, "cpu.cfs_period_us"), str(period))
            _write(os.path.join(path, "cpu.cfs_quota_us"), str(quota))
        return path

    def _do(self, argv: List[str], undo: Optional[List[str]] = None) -> None:
        _run(argv)
        if undo is not None:
            self._created.append(undo)

    def down(self) -> None:
        r"""Ends the processes started in the namespaces and removes everything created."""
        for proc in self._procs:
            if proc.poll() is None:
                _kill_tree(proc)
        self._procs = []
        # What those started in sessions of their own (torchrun's workers) is still inside a
        # node's namespace and cgroup: a rank left running there would hold its cores.
        _kill_inside([self.namespace(n) for n in range(self.nodes)], list(self._cgroups))
        while self._created:
            undo = self._created.pop()
            if undo[0] == "rmdir":
                _remove_cgroup(undo[1])
            else:
                _run(undo, check=False)
        self._cgroups = []
        self._up = False
        _OPEN.discard(self)

    # -- processes -----------------------------------------------------------------------------
    def env(self, node: int, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        r"""The environment of a process on :obj:`node`: the caller's, with gloo (and NCCL's
        socket transport) bound to the node's interface."""
        env = dict(os.environ)
        env.update(GLOO_SOCKET_IFNAME=self.interface(node),
                   NCCL_SOCKET_IFNAME=self.interface(node))
        env.update(extra or {})
        return env

    def popen(self, node: int, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
              **kwargs) -> subprocess.Popen:
        r"""Starts :obj:`argv` inside :obj:`node`'s namespace (in its own process group, so
        :meth:`down` ends it and everything it started)."""
        if not self._up:
            raise RuntimeError("the cluster is not up: use it as a context manager or call up()")
        cgroup = self._cgroups[node] if self._cgroups else None

        def enter() -> None:  # in the child, before exec: it and all it starts are held
            if cgroup is not None:
                _write(os.path.join(cgroup, "cgroup.procs"), str(os.getpid()))

        proc = subprocess.Popen(["ip", "netns", "exec", self.namespace(node), *argv],
                                env=self.env(node, env), start_new_session=True,
                                preexec_fn=enter if cgroup is not None else None, **kwargs)
        self._procs.append(proc)
        return proc

    def torchrun(self, args: Sequence[str], nproc_per_node: int = 1, port: int = 29611,
                 env: Optional[Dict[str, str]] = None, **kwargs) -> List[subprocess.Popen]:
        r"""One ``torchrun`` per node: ``--nnodes N --node-rank k`` with node 0's address as
        the rendezvous; :obj:`args` is the script (or ``-m module``) and its arguments."""
        procs = []
        for node in range(self.nodes):
            argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={self.nodes}",
                    f"--node-rank={node}", f"--nproc-per-node={nproc_per_node}",
                    f"--master-addr={self.address(0)}", f"--master-port={port}", *args]
            procs.append(self.popen(node, argv, env, **kwargs))
        return procs

    @staticmethod
    def wait(procs: Sequence[subprocess.Popen], timeout: float) -> List[Optional[int]]:
        r"""Exit codes of :obj:`procs`, ``None`` for each still running after :obj:`timeout`
        seconds (then ended with its process group)."""
        deadline = time.monotonic() + timeout
        codes: List[Optional[int]] = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                _kill_tree(proc)
                codes.append(None)
        return codes


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _cpu_hierarchy() -> str:
    r"""Where CPU-quota cgroups are made: cgroup v1's ``cpu`` hierarchy, else the v2 root
    (with the ``cpu`` controller enabled for its children)."""
    for path in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
        if os.path.exists(os.path.join(path, "cpu.cfs_quota_us")):
            return path
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        controllers = os.path.join(root, "cgroup.controllers")
        if os.path.exists(controllers) and "cpu" in open(controllers).read().split():
            control = os.path.join(root, "cgroup.subtree_control")
            if "cpu" not in open(control).read().split():
                _write(control, "+cpu")
            return root
    raise ClusterUnavailable("no cgroup CPU controller to hold nodes to `cpus` (mount cgroup "
                             "v1's cpu hierarchy or enable v2's cpu controller), or leave "
                             "cpus=None")


def _remove_cgroup(path: str) -> None:
    # Its processes were just killed: the kernel frees the group a moment later.
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def _kill_inside(namespaces: Sequence[str], cgroups: Sequence[str]) -> None:
    r"""Kills every process left in :obj:`namespaces` and :obj:`cgroups`."""
    pids = set()
    for namespace in namespaces:
        out = _run(["ip", "netns", "pids", namespace], check=False)
        pids.update(int(p) for p in out.stdout.split() if p.isdigit())
    for cgroup in cgroups:
        try:
            with open(os.path.join(cgroup, "cgroup.procs")) as f:
                pids.update(int(p) for p in f.read().split() if p.isdigit())
        except OSError:
            pass
    pids.discard(os.getpid())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_tree(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


_TEARDOWN_INSTALLED = [False]


def _install_teardown() -> None:
    r"""Removes every open cluster at interpreter exit and on SIGTERM/SIGINT (then the signal's
    previous handling continues): a namespace or bridge is never left behind."""
    if _TEARDOWN_INSTALLED[0]:
        return
    _TEARDOWN_INSTALLED[0] = True
    atexit.register(_down_all)
    import threading
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)

        def handler(num, frame, previous=previous):
            _down_all()
            if callable(previous):
                previous(num, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(num, signal.SIG_DFL)
                os.kill(os.getpid(), num)

        signal.signal(signum, handler)


def _down_all() -> None:
    for cluster in list(_OPEN):
        cluster.down()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_fullgraph.cluster",
        description="Run one command per node of an emulated cluster (network namespaces on a "
                    "bridge, links shaped with tc tbf), then remove it. In the command, {node}, "
                    "{nodes}, {master} and {iface} are replaced per node.")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rate", default="1gbit", help="link rate per node ('none': unshaped)")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command after '--', e.g. -- torchrun ... script.py")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run on every node after '--'")
    rate = None if str(args.rate).lower() == "none" else args.rate
    with EmulatedCluster(args.nodes, rate) as cluster:
        procs = [cluster.popen(node, [part.format(node=node, nodes=args.nodes,
                                                  master=cluster.address(0),
                                                  iface=cluster.interface(node))
                                      for part in command])
                 for node in range(args.nodes)]
        codes = cluster.wait(procs, args.timeout)
    failed = [c for c in codes if c != 0]
    return 0 if not failed else (failed[0] if failed[0] is not None else 124)


if __name__ == "__main__":
    sys.exit(main())
