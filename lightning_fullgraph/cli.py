"""``lightning-fullgraph``: partition a graph, train on it, inspect the result.

Run ``lightning-fullgraph --help`` or ``lightning-fullgraph COMMAND --help``.
"""
import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional, Tuple

__all__ = ["main", "build_parser"]

_EPILOG = """examples:
  lightning-fullgraph train                              # GCN on Cora, min(4, cores) processes
  lightning-fullgraph train --devices 1 --strategy pyg   # the same on one process, plain PyG
  lightning-fullgraph train --strategy pyg --loader neighbor --model sage  # NeighborLoader + DDP
  lightning-fullgraph train --dataset synthetic:nodes=200000,degree=10 --model sage --json
  lightning-fullgraph partition --dataset cora --parts 4 --out parts/cora-4
  lightning-fullgraph train --dataset parts/cora-4 --devices 4
  lightning-fullgraph plan --dataset cora --parts 2,4,8      # predicted bytes/time/memory

datasets: 'cora' (embedded), 'synthetic:nodes=N,degree=D,features=F,classes=C,seed=S',
or a partition directory written by 'partition'."""


_LEVELS_HELP = ("in-degree percentiles where the boundary nodes' importance levels 1, 2, 3 "
                "start (per-node widths 2, 4, 8 bits; below A: 1 bit), e.g. 50,80,95 for "
                "fewer wide rows (default: quartiles 25,50,75)")


def _codec_name(text: str) -> str:
    r"""A codec name :func:`~lightning_fullgraph.engine.codecs.codec_from_name` accepts."""
    from .engine.codecs.registry import codec_from_name
    try:
        codec_from_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text.strip().lower()


def _fixed_width_codec_name(text: str) -> str:
    name = _codec_name(text)
    if name.startswith("adaptive"):
        raise argparse.ArgumentTypeError("the planner predicts fixed-width codecs only: per-node "
                                         f"widths ({name!r}) are not predicted yet")
    return name


def _percentiles(text: str):
    r"""``"50,80,95"`` (percent) or ``"0.5,0.8,0.95"`` -> validated fractions."""
    from .partition.local import check_level_percentiles
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three numbers like 50,80,95, got {text!r}")
    if values and max(values) > 1:
        values = [v / 100 for v in values]
    try:
        return check_level_percentiles(values)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-fullgraph",
        description="Partitioned full-graph GNN training for PyTorch Geometric models "
                    "under PyTorch Lightning.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("partition", help="partition a graph with METIS and write per-rank files",
                       description="Partition a graph into per-rank files (owned nodes, local "
                                   "graph with halo, exchange plan) and print statistics.")
    p.add_argument("--dataset", default="cora", help="dataset name or spec (default: cora)")
    p.add_argument("--parts", type=int, default=4, help="number of parts = training processes")
    p.add_argument("--out", default=None,
                   help="directory to write a copy to (new, empty, or an older partition "
                        "directory, which is replaced; anything else is refused)")
    p.add_argument("--cache-dir", default=None, help="partition cache root")
    p.add_argument("--seed", type=int, default=0, help="METIS seed")
    p.add_argument("--hosts", type=int, default=None,
                   help="machines the parts will run on: ranks are placed on hosts so that "
                        "fewer rows cross machines (must divide --parts)")
    p.add_argument("--objective", default="vol", choices=["vol", "cut"],
                   help="what METIS minimizes: vol = the halo rows exchanged (default), "
                        "cut = the cut edges")
    p.add_argument("--level-percentiles", type=_percentiles, default=None, metavar="A,B,C",
                   help=_LEVELS_HELP)
    p.add_argument("--grid", type=_grid, default=None, metavar="X,Y,Z",
                   help="instead of METIS parts: cut the graph into the shards of a 4d grid "
                        "of X*Y*Z processes (train --strategy 4d --shards reads them; "
                        "--parts, --seed, --objective, --hosts do not apply)")
    p.add_argument("--force", action="store_true", help="re-partition even if cached")
    p.add_argument("--json", action="store_true", help="print statistics as JSON")
    p.add_argument("--normalize-features", default="auto", choices=["auto", "yes", "no"],
                   help="row-normalize features (auto: yes for Planetoid data)")

    t = sub.add_parser("train", help="train a PyG model full-graph on several processes",
                       description="Train a PyG BasicGNN model (GCN, GraphSAGE, GAT, GIN) for "
                                   "node classification with FullGraphStrategy and report "
                                   "accuracy and communication.")
    gd = t.add_argument_group("data and processes")
    gd.add_argument("--dataset", default="cora", help="dataset name, spec or partition dir")
    gd.add_argument("--model", default="gcn", choices=["gcn", "sage", "gat", "gin", "scalegnn"],
                    help="PyG BasicGNN model, or 'scalegnn' (ScaleGNN's residual GCN with "
                         "RMSNorm); with --strategy 4d every model but gat splits over --grid")
    gd.add_argument("--devices", type=int, default=None,
                    help="processes (default: one per CPU core, or per GPU with "
                         "--accelerator gpu, at most 4)")
    gd.add_argument("--num-nodes", type=int, default=1, help="machines (multi-node)")
    gd.add_argument("--strategy", default="fullgraph", choices=["fullgraph", "pyg", "4d"],
                    help="'fullgraph' (partitioned), 'pyg' (plain PyG's LightningNodeData, for "
                         "comparison: full batch on one process, or with --loader neighbor "
                         "NeighborLoader mini-batches data parallel over --devices with DDP) "
                         "or '4d' (ScaleGNN: sampled mini-batches, --dp replicas x a --grid "
                         "of processes)")
    gd.add_argument("--loader", default="full", choices=["full", "neighbor"],
                    help="pyg: 'full' (one process, whole graph) or 'neighbor' (PyG's "
                         "NeighborLoader: --batch-size seed nodes per step and process, "
                         "--num-neighbors per layer; needs torch-sparse or pyg-lib)")
    gd.add_argument("--num-neighbors", default=None, metavar="K1,K2,...",
                    help="pyg --loader neighbor: neighbours sampled per layer (default 25 "
                         "for the first layer, 10 for the others)")
    g4 = t.add_argument_group("4D strategy (FourDStrategy; --strategy 4d)")
    g4.add_argument("--dp", type=int, default=None,
                    help="4d: data-parallel replicas (default: devices x nodes / grid size)")
    g4.add_argument("--grid", default=(1, 1, 1), type=_grid, metavar="X,Y,Z",
                    help="4d: processes per replica along x, y, z (default 1,1,1: data "
                         "parallel only)")
    g4.add_argument("--batch-size", type=int, default=None,
                    help="4d: vertices sampled per step (default: half the graph, which "
                         "keeps a quarter of its edges); "
                         "pyg --loader neighbor: seed nodes per step and process (default 512)")
    g4.add_argument("--bf16-comm", action="store_true",
                    help="4d: the grid's partial sums and gradients cross the wire as "
                         "bfloat16 (lossy, about half the bytes)")
    g4.add_argument("--steps-per-epoch", type=int, default=None,
                    help="4d: steps per epoch (default: nodes / batch size, rounded up)")
    g4.add_argument("--shards", action="store_true",
                    help="4d: every process holds only its grid position's part of the graph "
                         "and features (ScaleGNN Alg. 2), cut once into --cache-dir; the "
                         "batches are stratified over the grid's vertex ranges")
    gm = t.add_argument_group("model and optimization")
    gm.add_argument("--epochs", type=int, default=200)
    gm.add_argument("--val-every", type=int, default=None, metavar="N",
                    help="validate every N epochs (default: 20 validations per run); the "
                         "--json summary's val_trace gives training seconds and accuracy at "
                         "each, for time-to-accuracy comparisons")
    gm.add_argument("--hidden", type=int, default=16, help="hidden channels")
    gm.add_argument("--layers", type=int, default=2, help="message-passing layers")
    gm.add_argument("--dropout", type=float, default=0.5)
    gm.add_argument("--lr", type=float, default=0.01)
    gm.add_argument("--weight-decay", type=float, default=5e-4)
    gm.add_argument("--norm", default=None, help="normalization between layers, e.g. batch_norm")
    gm.add_argument("--seed", type=int, default=0)
    gm.add_argument("--normalize-features", default="auto", choices=["auto", "yes", "no"],
                    help="row-normalize features (auto: yes for Planetoid data, as Kipf & "
                         "Welling and PyG's examples, and as FullGraphDataModule('cora'))")
    gk = t.add_argument_group("kernels (KernelConfig)")
    gk.add_argument("--kernels", default="auto", choices=["auto", "cpp", "triton", "torch", "pyg"],
                    help="aggregation backend ('pyg': PyG's own scatter path)")
    gk.add_argument("--huge-pages", default="auto", choices=["auto", "on", "off"],
                    help="large CPU tensors in transparent huge pages with the CPU kernels "
                         "('on' swaps torch's CPU allocator for the run; default 'auto': the "
                         "process's mode, off unless LIGHTNING_FULLGRAPH_HUGE_PAGES says on)")
    gx = t.add_argument_group("halo exchange (ExchangeConfig; --strategy fullgraph)")
    gx.add_argument("--aggregation", default="hybrid", choices=["hybrid", "post", "pre", "auto"],
                    help="how cut edges of GCN/SAGE/GIN-like layers cross the wire: 'post' "
                         "sends source rows, 'pre' partial aggregates, 'hybrid' the smaller "
                         "mix per rank pair (default; all three are exact), 'auto' the one "
                         "of the three predicted fastest per layer on the link (--link, "
                         "else measured at the first exchange)")
    gx.add_argument("--codec", default="fp32", type=_codec_name,
                    metavar="{fp32,bf16,int8,int4,int2,int1,adaptive,adaptive2}[-nearest][-compact]",
                    help="wire format of halo rows and gradients (default fp32: exact; the "
                         "others are lossy: rows quantized per row with scale and zero point "
                         "on the wire, stochastic rounding unless '-nearest'; '-compact': a "
                         "4-byte bfloat16 header instead of 8 bytes, for narrow rows; "
                         "'adaptive': per-node widths 1-8 by global in-degree quartile, or "
                         "--level-percentiles; 'adaptive2': the same with at least 2 bits)")
    gx.add_argument("--level-percentiles", type=_percentiles, default=None, metavar="A,B,C",
                    help=_LEVELS_HELP + "; with --codec adaptive or adaptive2")
    gx.add_argument("--adaptive-bits", action="store_true",
                    help="change the quantized codec's width every epoch (1, 2, 4 or 8 bits, "
                         "starting at 1) from the loss-descent rate of all ranks (SYLVIE; the "
                         "AdaptiveBitWidth callback); needs --codec int1/int2/int4/int8 or "
                         "adaptive")
    gx.add_argument("--cache", default="none", metavar="{none,adaptive,budgeted,EPSILON}",
                    help="adaptive halo cache (CDFGNN): resend a row or gradient only when it "
                         "moved by more than a relative threshold; 'adaptive' adapts the "
                         "threshold from the training accuracy (AdaptiveCacheThreshold, "
                         "starting at 0.01), 'budgeted' too, in one collective per exchange "
                         "(row counts agreed a step ahead), a number fixes it (0 is exact); "
                         "default none")
    gx.add_argument("--pipeline", default="sync", choices=["sync", "async", "adaptive"],
                    help="halo exchange pipeline: 'sync' (default, exact), 'async' (PipeGCN: "
                         "halo rows and gradients one epoch stale while this epoch's are in "
                         "flight, a synchronous epoch after 10 async ones), 'adaptive' (SYLVIE: "
                         "sync or async per epoch from the loss-descent rate)")
    gx.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                    help="overlap the synchronous halo exchange with the aggregation of the "
                         "edges whose sources are local, forward and backward (sum and mean "
                         "layers on the kernels; exact to rounding; default on)")
    gx.add_argument("--duplex", action=argparse.BooleanOptionalAction, default=False,
                    help="on gloo, send each exchange's two directions at once on two process "
                         "groups (gloo carries one direction of a connection at a time; exact; "
                         "two collectives per exchange; with --step-aside kept only where it "
                         "shortens the step; default off)")
    gx.add_argument("--step-aside", action=argparse.BooleanOptionalAction, default=True,
                    help="after a few epochs, time the reductions on (pre/hybrid/auto aggregation, "
                         "codec, cache, pipeline, boundary sampling, duplex) against the epoch "
                         "with each left out, and keep only those that shorten it (all ranks "
                         "decide alike; logged; default on; --no-step-aside keeps them "
                         "throughout)")
    gx.add_argument("--sampling", dest="sampling", type=float,
                    default=None, metavar="P",
                    help="boundary node sampling (BNS-GCN): keep a fraction P in (0, 1] of "
                         "each rank's halo nodes (and of the partial aggregates of pre/hybrid "
                         "aggregation) per epoch, scaled by 1/P (1 is exact)")
    gt = t.add_argument_group("timeouts (TimeoutConfig)")
    gt.add_argument("--timeout", type=float, default=300.0,
                    help="collective timeout in seconds: a rank waiting longer for a stuck "
                         "peer stops with an error naming the exchange (default: 300)")
    gt.add_argument("--startup-timeout", type=float, default=1800.0,
                    help="seconds to wait for all processes to start and for rank 0 to "
                         "partition the graph (default: 1800)")
    gd.add_argument("--num-classes", type=int, default=None,
                    help="number of classes; labels are checked against it before "
                         "partitioning (default: largest label + 1)")
    gd.add_argument("--cache-dir", default=None, help="partition cache root")
    gd.add_argument("--accelerator", default="cpu")
    go = t.add_argument_group("output")
    go.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    go.add_argument("--save-link", default=None, metavar="FILE.json",
                    help="write the latency/bandwidth fitted to this run's exchanges (the link "
                         "as training meets it; --strategy fullgraph, more than one process), "
                         "for 'plan --link FILE.json'")
    go.add_argument("--link", default=None, metavar="calibrate|FILE.json",
                    help="predict the exchange and codec seconds of each training step on this "
                         "link: 'calibrate' measures it at fit start (ping-pong collectives "
                         "and the codec, a few seconds), or a file written by --save-link "
                         "(--strategy fullgraph)")
    go.add_argument("--json", action="store_true", help="print the summary as JSON (rank 0)")
    # main() refuses, with this parser's usage, the options the chosen strategy would ignore.
    t.set_defaults(command_parser=t)
    _add_plan_parser(sub)
    return parser


def _grid(text: str) -> Tuple[int, int, int]:
    r"""``"2,1,1"`` -> ``(2, 1, 1)`` (argparse type of ``train --grid``)."""
    try:
        grid = tuple(int(v) for v in str(text).split(","))
    except ValueError:
        grid = ()
    if len(grid) != 3 or any(v < 1 for v in grid):
        raise argparse.ArgumentTypeError(
            f"must be three positive process counts X,Y,Z, e.g. 2,1,1 (got {text!r})")
    return grid


def _default_devices(accelerator: str) -> int:
    r"""Processes when ``--devices`` is not given: one per CPU core (or per GPU), at most 4.

    More processes than cores only makes the ranks wait for each other (each one's share of
    the graph gets no core of its own), so a 2-core machine runs 2.
    """
    count = 0
    if accelerator.lower() in ("gpu", "cuda", "auto"):
        import torch
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0 and accelerator.lower() in ("cpu", "auto"):
        count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else (os.cpu_count() or 1)
    return max(1, min(4, count))


def _step_aside_decision(strategy) -> Optional[dict]:
    engine = getattr(strategy, "engine", None)
    aside = getattr(engine, "step_aside", None)
    return None if aside is None else aside.decision


def _auto_choices(strategy) -> Optional[Dict[str, dict]]:
    engine = getattr(strategy, "engine", None)
    router = getattr(engine, "router", None)
    if router is None:
        return None
    return {layer: {"mode": mode, "predicted_s": {m: round(t, 6) for m, t in seconds.items()}}
            for layer, (mode, seconds) in router.auto_choices.items()}


def _timeouts(args):
    from .strategies import TimeoutConfig
    return TimeoutConfig(startup=args.startup_timeout, collectives=args.timeout)


def _train_option_scope(args) -> List[Tuple[str, str]]:
    r"""``(option, what it needs)`` of every ``train`` option the chosen set-up reads."""
    fullgraph, fourd, pyg = (args.strategy == s for s in ("fullgraph", "4d", "pyg"))
    neighbor = pyg and args.loader == "neighbor"
    scope = [
        (fullgraph, "--strategy fullgraph",
         ("aggregation", "codec", "cache", "pipeline", "overlap", "step_aside",
          "sampling", "duplex",
          "kernels", "huge_pages", "link")),
        (fourd, "--strategy 4d", ("dp", "grid", "bf16_comm", "steps_per_epoch", "shards")),
        (fullgraph or (fourd and args.shards), "--strategy fullgraph or --strategy 4d --shards",
         ("cache_dir", )),
        (not pyg, "--strategy fullgraph or 4d", ("timeout", "startup_timeout")),
        (fourd or neighbor, "--strategy 4d or --strategy pyg --loader neighbor",
         ("batch_size", )),
        (neighbor, "--strategy pyg --loader neighbor", ("num_neighbors", )),
        (args.model != "scalegnn", "a --model other than scalegnn, which has RMSNorm built in",
         ("norm", )),
    ]
    return [(name, needs) for applies, needs, names in scope if not applies for name in names]


def _check_train_options(args) -> None:
    r"""Refuses options that the chosen strategy would silently ignore (argparse's error:
    the usage line and exit status 2), naming them and what they need."""
    parser = args.command_parser
    given: Dict[str, List[str]] = {}
    for name, needs in _train_option_scope(args):
        value, default = getattr(args, name), parser.get_default(name)
        if value != default:
            negated = value is False and default is True  # given as --no-<name>
            given.setdefault(needs, []).append(("--no-" if negated else "--")
                                               + name.replace("_", "-"))
    if given:
        got = f"--strategy {args.strategy}" + (f" --loader {args.loader}"
                                               if args.strategy == "pyg" else "")
        if args.model == "scalegnn":
            got += " --model scalegnn"
        problems = "; ".join(
            f"{_listed(names)} {'applies' if len(names) == 1 else 'apply'} only with {needs}"
            for needs, names in given.items())
        one = sum(map(len, given.values())) == 1
        parser.error(f"{problems} (got {got}): remove {'it' if one else 'them'}, or choose "
                     f"the set-up {'it applies' if one else 'they apply'} to")


def _listed(names: List[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _parts_list(text: str) -> List[int]:
    r"""``"2,4,8"`` -> ``[2, 4, 8]`` (argparse type of ``plan --parts``)."""
    items = [t.strip() for t in str(text).split(",")]
    try:
        values = [int(t) for t in items]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"must be a comma-separated list of part counts >= 1, e.g. 2,4,8 (got {text!r})")
    return sorted(set(values))


def _add_plan_parser(sub) -> None:
    q = sub.add_parser(
        "plan", help="predict halo-exchange bytes, time and memory per aggregation mode",
        description="Predict, before training, the bytes and time of the halo exchange per "
                    "epoch and the memory per rank, for several part counts and each "
                    "aggregation mode (post, pre, hybrid), from the partitions' exchange "
                    "plans, the model's exchange widths and a measured latency/bandwidth "
                    "(SuperGCN's communication model).",
        epilog="example: lightning-fullgraph plan --dataset cora --parts 2,4,8 "
               "--plot plan-cora.png")
    q.add_argument("--dataset", default="cora", help="dataset name or spec (default: cora)")
    q.add_argument("--parts", type=_parts_list, default=[2, 4, 8],
                   help="comma-separated part counts (default: 2,4,8)")
    q.add_argument("--model", default="gcn", choices=["gcn", "sage", "gat", "gin"])
    q.add_argument("--hidden", type=int, default=16, help="hidden channels (default: 16)")
    q.add_argument("--layers", type=int, default=2, help="message-passing layers (default: 2)")
    q.add_argument("--dropout", type=float, default=0.5,
                   help="dropout, also on the input features as 'train' applies it")
    q.add_argument("--aggregation", default="all", choices=["all", "post", "pre", "hybrid"],
                   help="aggregation mode(s) to predict (default: all)")
    q.add_argument("--hosts", type=int, default=1,
                   help="machines the ranks run on (host-aware partitions; must divide every "
                        "--parts value); inter-host bytes are reported")
    q.add_argument("--objective", default="vol", choices=["vol", "cut"],
                   help="what METIS minimizes: vol = the halo rows exchanged (default), "
                        "cut = the cut edges")
    q.add_argument("--link", default=None, metavar="FILE.json",
                   help="latency/bandwidth from a file written by --save-link (of 'plan', or "
                        "of 'train': fitted to a run's exchanges) instead of measuring them; "
                        "'none': predict no times")
    q.add_argument("--link-rate", default=None, metavar="RATE",
                   help="each machine's network link, as tc writes rates ('1gbit', '100mbit', "
                        "'125mbps' for bytes): caps the bandwidth of the measured (or --link) "
                        "model at it, the latency stays measured")
    q.add_argument("--duplex", action="store_true",
                   help="predict exchanges that send their two directions at once on two "
                        "groups ('train --duplex'), at the duplex gain measured on the "
                        "cluster: needs a --link file that holds one ('train --duplex --link "
                        "calibrate --save-link FILE.json' writes it)")
    q.add_argument("--calibration-processes", type=int, default=2,
                   help="local gloo processes the latency/bandwidth are measured on "
                        "(default: 2)")
    q.add_argument("--save-link", default=None, metavar="FILE.json",
                   help="write the measured latency/bandwidth to a file")
    q.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw bytes, time and memory against the part count (needs "
                        "matplotlib: pip install 'lightning-fullgraph[plot]')")
    q.add_argument("--codec", default="fp32", type=_fixed_width_codec_name,
                   metavar="{fp32,bf16,int8,int4,int2,int1}[-nearest][-compact]",
                   help="wire format of the halo rows whose bytes are predicted (default fp32; "
                        "'-compact': the 4-byte header)")
    q.add_argument("--json", action="store_true", help="print only JSON on stdout")
    q.add_argument("--cache-dir", default=None, help="partition cache root")
    q.add_argument("--seed", type=int, default=0, help="METIS seed")
    q.add_argument("--normalize-features", default="auto", choices=["auto", "yes", "no"],
                   help="row-normalize features (auto: yes for Planetoid data; as 'partition' "
                        "and 'train', so their cached partitions are reused)")


def _plan(args) -> int:
    from .planner.link import LinkModel
    from .planner.sweep import format_sweep, plan_sweep

    def say(line: str) -> None:
        print(f"[plan] {line}", file=sys.stderr, flush=True)

    for name in ("hidden", "layers", "hosts", "calibration_processes"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, "
                             f"got {getattr(args, name)}")
    rate = None
    if args.link_rate:  # checked before anything is measured
        from .cluster import parse_rate
        if args.link and args.link.lower() == "none":
            raise ValueError("--link-rate caps a link model's bandwidth; --link none predicts "
                             "no times: drop one of them")
        rate = parse_rate(args.link_rate)
    if args.duplex and (not args.link or args.link.lower() == "none"):
        raise ValueError("--duplex predicts at the duplex gain measured on the cluster: pass "
                         "--link FILE.json with one (written by 'train --duplex --link "
                         "calibrate --save-link FILE.json' there); two processes on this "
                         "machine's loopback measure nothing a network link gains")
    bad = [p for p in args.parts if p % args.hosts]
    if bad:
        raise ValueError(f"--hosts {args.hosts} must divide every --parts value; "
                         f"{', '.join(map(str, bad))} {'is' if len(bad) == 1 else 'are'} not "
                         "a multiple of it")
    if args.plot:
        from .planner.plot import require_matplotlib
        require_matplotlib()  # fail before the work, naming the extra to install
    modes = ("post", "pre", "hybrid") if args.aggregation == "all" else (args.aggregation, )
    data = _load(args)
    if max(args.parts) > data.num_nodes:
        raise ValueError(f"--parts {max(args.parts)} exceeds the {data.num_nodes} nodes of "
                         f"{args.dataset}")
    if args.link and args.link.lower() == "none":
        link = None
    elif args.link:
        link = LinkModel.load(args.link)
        say(f"link from {args.link}: {link.describe()}")
    else:
        from .planner.calibrate import calibrate_local
        say(f"calibrating all_to_all latency/bandwidth on {args.calibration_processes} local "
            "gloo processes ...")
        link = calibrate_local(args.calibration_processes)
        say(f"link: {link.describe()}")
    if link is not None and rate is not None:
        link = link.limited_to(rate)
        say(f"link capped at {args.link_rate}: {link.describe()}")
    if link is not None and args.save_link:
        link.save(args.save_link)
    if args.duplex:
        if link.duplex_gain == 1.0:
            raise ValueError(f"--duplex: the link in {args.link} holds no duplex gain; write "
                             "one with 'train --duplex --link calibrate --save-link "
                             "FILE.json' on the cluster (or planner.calibrate(duplex=True))")
        gain, link = link.duplex_gain, link.duplexed()
        if rate is not None:  # both directions at once still move at most the rate each way
            link = link.limited_to(rate)
        say(f"both directions at once, {gain:.2f}x the bandwidth: {link.describe()}")
    result = plan_sweep(data, args.parts, dataset=args.dataset, model=args.model,
                        hidden=args.hidden, layers=args.layers, dropout=args.dropout,
                        modes=modes, hosts=args.hosts, link=link, cache_dir=args.cache_dir,
                        seed=args.seed, codec=args.codec, objective=args.objective,
                        progress=say)
    if args.duplex:
        result["duplex_gain"] = gain  # the link in the result is the duplexed one
    if args.plot:
        from .planner.plot import plot_sweep
        result["plot"] = str(plot_sweep(result, args.plot))
        say(f"plot written to {result['plot']}")
    if args.json:
        print(json.dumps(result, indent=2), flush=True)
    else:
        print(format_sweep(result), flush=True)
    return 0


def _partition(args) -> int:
    from .partition import export_partition, partition_graph, read_manifest
    data = _load(args)
    if args.grid is not None:
        from .parallel.shards import read_meta, write_shards
        parts = args.grid[0] * args.grid[1] * args.grid[2]
        path = write_shards(data, _shards_root(args), parts)
        meta = read_meta(_shards_root(args), parts)
        print(json.dumps({"directory": str(path), **meta}) if args.json else
              f"4d shards for {parts} processes per grid: {path} ({meta['num_nodes']} nodes, "
              f"{meta['num_edges']} normalized edges in {parts * parts} tiles)")
        return 0
    path = partition_graph(data, args.parts, root=args.cache_dir, seed=args.seed,
                           force=args.force, hosts=args.hosts, objective=args.objective,
                           level_percentiles=args.level_percentiles)  # progress: stderr
    if args.out:
        path = export_partition(path, args.out)  # never deletes what it did not write
    manifest = read_manifest(path)
    if args.json:
        print(json.dumps({"directory": str(path), "num_parts": manifest["num_parts"],
                          "fingerprint": manifest["fingerprint"],
                          "options": manifest.get("options"),
                          "stats": manifest.get("stats")}, indent=2))
    else:
        print(f"partitions written to {path}")
    return 0


def _train(args) -> int:
    import lightning.pytorch as pl

    from . import CommunicationMonitor, FullGraphDataModule, FullGraphStrategy
    from .kernels import KernelConfig
    from .callbacks import ValidationTrace
    from .module import NodeClassifier, build_model

    if args.adaptive_bits and (args.strategy != "fullgraph"
                               or not args.codec.startswith(("int", "adaptive"))):
        raise ValueError(f"--adaptive-bits changes the width of a quantized wire format; it "
                         f"needs --strategy fullgraph and --codec int1/int2/int4/int8 or "
                         f"adaptive (got --strategy {args.strategy} --codec {args.codec})")
    if args.level_percentiles is not None and (args.strategy != "fullgraph"
                                               or not args.codec.startswith("adaptive")):
        raise ValueError(f"--level-percentiles sets the per-node widths of --codec adaptive; "
                         f"it needs --strategy fullgraph and --codec adaptive or adaptive2 "
                         f"(got --strategy {args.strategy} --codec {args.codec})")
    if args.save_link and args.strategy != "fullgraph":
        raise ValueError(f"--save-link writes the link fitted to the halo exchanges: it needs "
                         f"--strategy fullgraph (got --strategy {args.strategy})")
    if args.model == "scalegnn" and args.strategy != "4d":
        raise ValueError("--model scalegnn trains on sampled mini-batches: use --strategy 4d")
    if args.loader != "full" and args.strategy != "pyg":
        raise ValueError(f"--loader {args.loader} is PyG's own mini-batch training: use "
                         f"--strategy pyg (got --strategy {args.strategy})")
    devices_given = args.devices
    if args.devices is None:
        args.devices = _default_devices(args.accelerator)
    if args.strategy == "4d":
        # Here, before any process starts: an error raised by every rank would print once per
        # rank.
        from .parallel.dims import FourDDims
        FourDDims.for_world(args.devices * args.num_nodes, args.grid, args.dp)
    pl.seed_everything(args.seed, verbose=False)
    if args.strategy == "4d":
        from .data.sampled import SampledNodeDataModule
        from .strategies import FourDStrategy
        # Half the graph: a uniform sample of B vertices keeps (B / N)^2 of the edges, and a
        # quarter (1/16 of the edges) trained GCN 3-5 pp below NeighborLoader GraphSAGE on
        # Cora where half is above it (python -m benchmarks fourd; docs/fourd.md).
        if args.shards:
            # No process loads the graph once its shards exist: local rank 0 writes them
            # (prepare_data) the first time, every process then reads its own.
            from .data.sampled import ShardedNodeDataModule
            datamodule = ShardedNodeDataModule(_shards_root(args), data=lambda: _load(args),
                                               batch_size=args.batch_size,
                                               steps_per_epoch=args.steps_per_epoch,
                                               seed=args.seed)
            num_features, num_classes = None, args.num_classes  # sized in configure_model
        else:
            data = _load(args)
            batch_size = args.batch_size or max(2, int(data.num_nodes) // 2)
            datamodule = SampledNodeDataModule(data, batch_size, args.steps_per_epoch,
                                               seed=args.seed)
            num_features, num_classes = data.num_features, _num_classes(args, data)
        strategy = FourDStrategy(dp=args.dp, grid=args.grid, seed=args.seed,
                                 bf16_comm=args.bf16_comm, timeout=_timeouts(args))
        devices, callbacks = args.devices, [CommunicationMonitor()]
    elif args.strategy == "pyg":
        from torch_geometric.data.lightning import LightningNodeData
        data = _load(args)
        num_features, num_classes = data.num_features, _num_classes(args, data)
        callbacks = [CommunicationMonitor()]
        if args.loader == "neighbor":
            fanout = _num_neighbors(args)
            _require_neighbor_sampling()
            datamodule = LightningNodeData(data, loader="neighbor", num_neighbors=fanout,
                                           batch_size=_neighbor_batch(args),
                                           pin_memory=False)
            distributed = args.devices * args.num_nodes > 1
            strategy, devices = ("ddp" if distributed else "auto"), args.devices
        else:
            datamodule = LightningNodeData(data, loader="full")
            strategy, devices = "auto", 1
            if devices_given not in (None, 1):
                print("note: --strategy pyg runs on one process (--loader neighbor trains "
                      "data parallel)", file=sys.stderr)
    else:
        # Only local rank 0 of each node touches the global graph (in prepare_data: it
        # validates, partitions or hits the cache); every rank then loads its own part.
        datamodule = FullGraphDataModule(args.dataset, cache_dir=args.cache_dir, seed=args.seed,
                                         num_classes=args.num_classes,
                                         normalize_features=_normalize_features(args),
                                         level_percentiles=args.level_percentiles)
        kernels = KernelConfig(backend=None if args.kernels == "pyg" else args.kernels,
                               huge_pages={"auto": None, "on": True,
                                           "off": False}[args.huge_pages])
        strategy = FullGraphStrategy(kernels=kernels, exchange=_exchange_config(args),
                                     timeout=_timeouts(args))
        devices, callbacks = args.devices, [CommunicationMonitor(save_link=args.save_link,
                                                             link=_train_link(args.link))]
        if args.adaptive_bits:
            from .callbacks import AdaptiveBitWidth
            callbacks.append(AdaptiveBitWidth())
        if args.cache in ("adaptive", "budgeted"):
            from .callbacks import AdaptiveCacheThreshold
            callbacks.append(AdaptiveCacheThreshold())
        if args.pipeline == "adaptive":
            from .callbacks import PipelineAdaptor
            callbacks.append(PipelineAdaptor())
        num_features = num_classes = None  # sized from the partitions in configure_model

    def model(in_channels: int, out_channels: int):
        if args.model == "scalegnn":
            from .parallel import ScaleGNN
            return ScaleGNN(in_channels, args.hidden, args.layers, out_channels, args.dropout)
        if args.strategy == "4d" and args.model == "gcn":
            # The sampled batches carry normalized, rescaled weights: no second gcn_norm.
            from torch_geometric.nn.models import GCN
            return GCN(in_channels, args.hidden, args.layers, out_channels,
                       dropout=args.dropout, norm=args.norm, normalize=False)
        return build_model(args.model, in_channels, args.hidden, out_channels,
                           num_layers=args.layers, dropout=args.dropout, norm=args.norm)

    trace = ValidationTrace()
    callbacks.append(trace)
    if num_features is not None:
        model = model(num_features, num_classes)
    module = NodeClassifier(model, num_classes, lr=args.lr, weight_decay=args.weight_decay,
                            input_dropout=args.dropout, use_edge_weight=args.strategy == "4d")
    trainer = pl.Trainer(accelerator=args.accelerator, devices=devices,
                         num_nodes=args.num_nodes, strategy=strategy,
                         max_epochs=args.epochs, logger=False, enable_checkpointing=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         check_val_every_n_epoch=args.val_every or max(1, args.epochs // 20),
                         enable_progress_bar=not (args.no_progress or args.json),
                         callbacks=callbacks)
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    fit_seconds = time.perf_counter() - start
    if args.save_link and trainer.is_global_zero:
        fitted = callbacks[0].fitted_link
        print(f"link fitted to the run's exchanges: {fitted.describe()}; written to "
              f"{args.save_link}" if fitted is not None else
              f"note: no link was fitted (it needs 2+ processes, 2+ epochs and a wire format "
              f"the planner models: not --codec adaptive); {args.save_link} not written",
              file=sys.stderr)
    # Means over the run: the width (--adaptive-bits) and what crosses the wire can change
    # from epoch to epoch; the last epoch's bytes are reported beside them.
    comm = callbacks[0].run_mean() if callbacks else {}
    last = dict(callbacks[0].last) if callbacks else {}
    val_acc = float(trainer.callback_metrics.get("val_acc", float("nan")))
    test = trainer.test(module, datamodule=datamodule, verbose=False)
    nodes = datamodule.partition.num_nodes if args.strategy == "fullgraph" \
        else datamodule.num_nodes if args.strategy == "4d" else int(datamodule.data.num_nodes)
    fourd = args.strategy == "4d"
    summary = {
        "dataset": args.dataset, "nodes": nodes, "model": args.model, "strategy": args.strategy,
        "processes": trainer.world_size, "epochs": args.epochs, "seed": args.seed,
        "aggregation": args.aggregation if args.strategy == "fullgraph" else None,
        "codec": args.codec if args.strategy == "fullgraph" else None,
        "level_percentiles": list(args.level_percentiles) if args.level_percentiles else None,
        "cache": args.cache if args.strategy == "fullgraph" else None,
        "pipeline": args.pipeline if args.strategy == "fullgraph" else None,
        "sampling": args.sampling if args.strategy == "fullgraph" else None,
        "overlap": bool(args.overlap) if args.strategy == "fullgraph" else None,
        # The reductions the step-aside trial kept (--step-aside), with its step times.
        "step_aside": _step_aside_decision(strategy) if args.strategy == "fullgraph" else None,
        # --aggregation auto: the mode each layer runs, with the predicted seconds per mode.
        "aggregation_choices": _auto_choices(strategy) if args.strategy == "fullgraph"
        and args.aggregation == "auto" else None,
        # Whether large CPU tensors were in huge pages while rank 0 trained (--huge-pages).
        "huge_pages": strategy.huge_pages_active if args.strategy == "fullgraph" else None,
        "loader": args.loader if args.strategy == "pyg" else None,
        "num_neighbors": _num_neighbors(args) if args.loader == "neighbor" else None,
        "dp": strategy.dims.dp if fourd else None,
        "grid": list(strategy.grid) if fourd else None,
        "batch_size": datamodule.batch_size if fourd
        else _neighbor_batch(args) if args.loader == "neighbor" else None,
        "train_steps_per_epoch": trainer.num_training_batches,
        "bf16_comm": bool(args.bf16_comm) if fourd else None,
        "sampling_s_per_epoch": datamodule.sample_seconds / max(1, args.epochs) if fourd
        else None,
        "sampling_hidden_frac": (1.0 - datamodule.wait_seconds / datamodule.sample_seconds)
        if fourd and datamodule.sample_seconds > 0 else None,
        # This process's peak resident memory (rank 0's, the one that prints), and the
        # largest of every process's.
        "peak_rss_MiB": _peak_rss_mib(),
        "peak_rss_MiB_max_rank": _peak_rss_max_rank(trainer),
        "shards": bool(args.shards) if fourd else None,
        "test_acc": float(test[0]["test_acc"]), "val_acc": val_acc,
        # [epoch, seconds of training so far, validation accuracy] at every validation.
        "val_trace": [[p["epoch"], round(p["train_s"], 4), p["val_acc"]]
                      for p in trace.points],
        "fit_seconds": round(fit_seconds, 3),
        "train_step_seconds": _median_step(callbacks),
        # Rank 0's training step, exposed exchange time and bytes sent, epoch by epoch.
        "per_epoch": _per_epoch(callbacks),
        "comm_MB_per_epoch_per_rank": comm.get("comm/sent_MB"),
        "comm_MB_per_epoch_max_rank": comm.get("comm/sent_MB_max"),
        "comm_MB_last_epoch_per_rank": last.get("comm/sent_MB"),
        # The planner's bytes for the same epochs (the engine's plans and the model's calls).
        "comm_MB_predicted_per_epoch_per_rank": comm.get("comm/predicted_sent_MB"),
        "bits_mean": comm.get("comm/bits"), "bits_last": last.get("comm/bits"),
        "rows_skipped_frac": comm.get("comm/rows_skipped_frac"),
        "rows_skipped_frac_forward": comm.get("comm/rows_skipped_frac_forward"),
        "rows_skipped_frac_backward": comm.get("comm/rows_skipped_frac_backward"),
        "exchange_s_per_epoch": comm.get("comm/exchange_s"),
        # The training steps alone (rank 0, median over epochs): exchange and the rest.
        "train_step_exchange_seconds": _median_step(callbacks, "comm/step_exchange_s"),
        "train_step_compute_seconds": _median_step(callbacks, "comm/step_compute_s"),
        # The least over ranks (median over epochs): without the wait at the gradient
        # all-reduce for the rank that arrived last.
        "train_step_compute_seconds_min": _median_step(callbacks, "comm/step_compute_s_min"),
        # The planner's step terms on --link (last epoch: the calls are recorded by then).
        "predicted_step_exchange_seconds": last.get("comm/predicted_step_exchange_s"),
        "predicted_step_codec_seconds": last.get("comm/predicted_step_codec_s"),
        "predicted_step_exposed_seconds": last.get("comm/predicted_step_exposed_s"),
        "predicted_step_link_seconds": last.get("comm/predicted_step_link_s"),
        "link_contention": last.get("comm/link_contention"),
        "link_queue_wait_seconds": last.get("comm/link_queue_wait_s"),
        "link_duplex_gain": last.get("comm/link_duplex_gain"),
        "train_step_collectives": last.get("comm/step_collectives"),
        "compute_s_per_epoch": comm.get("comm/compute_s"),
    }
    if trainer.global_rank == 0:
        if args.json:
            print(json.dumps(summary, indent=2), flush=True)
        else:
            _print_summary(summary)
    return 0


def _neighbor_batch(args) -> int:
    return args.batch_size or 512  # seed nodes per step and process (--batch-size's help)


def _num_neighbors(args) -> List[int]:
    if args.num_neighbors is None:
        return [25] + [10] * (args.layers - 1)
    try:
        fanout = [int(v) for v in args.num_neighbors.split(",")]
    except ValueError:
        fanout = []
    if len(fanout) != args.layers or any(k == 0 or k < -1 for k in fanout):
        raise ValueError(f"--num-neighbors needs one count per layer ({args.layers} for "
                         f"--layers {args.layers}), each >= 1 or -1 for all, e.g. 25,10 "
                         f"(got {args.num_neighbors!r})")
    return fanout


def _require_neighbor_sampling() -> None:
    import torch_geometric.typing as pyg_typing
    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
        raise ImportError("--loader neighbor uses PyG's NeighborLoader, which needs pyg-lib "
                          "or torch-sparse; neither is installed. Install one of them (pyg-lib "
                          "wheels: https://data.pyg.org/whl/; or build torch-sparse: pip "
                          "install --no-build-isolation torch-scatter torch-sparse), or use "
                          "--loader full")


def _load(args):
    from .data import load_dataset
    return load_dataset(args.dataset, normalize_features=_normalize_features(args))


def _normalize_features(args):
    r"""``--normalize-features`` as :func:`~lightning_fullgraph.data.load_dataset` takes it:
    ``auto`` is its default (Cora's features row-normalized), the one every entry point
    shares."""
    return {"auto": "auto", "yes": True, "no": False}[args.normalize_features]


def _num_classes(args, data) -> int:
    r"""``--num-classes`` (labels checked against it) or the largest label + 1."""
    if args.num_classes is None:
        return int(data.y.max()) + 1
    import torch
    from .data.validation import check_label_range
    check_label_range([(torch.arange(int(data.num_nodes)), data.y)], args.num_classes)
    return args.num_classes


def _shards_root(args) -> str:
    r"""Where ``--shards`` cuts ``--dataset``: one directory per data set (and feature
    normalization) under ``--cache-dir``'s root."""
    import re
    from pathlib import Path

    from .partition.store import default_cache_root
    root = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_root()
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{args.dataset}-norm_{args.normalize_features}")
    return str(root / "4d-shards" / name)


def _peak_rss_max_rank(trainer) -> Optional[float]:
    r"""The largest peak resident memory of all processes (every rank calls it), in a
    collective bounded by the strategy's collective timeout (after the run, the default group
    is back at the start-up timeout: a lost peer would hold the others that long)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from . import compat
    rss = _peak_rss_mib()
    if rss is None or trainer.world_size == 1 or not (dist.is_available()
                                                      and dist.is_initialized()):
        return rss
    strategy = trainer.strategy
    compat.set_group_timeout(getattr(strategy, "collective_timeout", timedelta(minutes=5)))
    try:
        value = torch.tensor([rss], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    finally:  # the group's timeout as the strategy set it
        timeouts = getattr(strategy, "timeouts", None)
        if timeouts is not None:
            compat.set_group_timeout(timeouts.startup)
        else:
            from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
            compat.set_group_timeout(default_pg_timeout)
    return float(value)


def _peak_rss_mib() -> Optional[float]:
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _exchange_config(args):
    r"""``train``'s exchange options as the :class:`~.engine.ExchangeConfig` they make."""
    from .engine import ExchangeConfig
    link = _train_link(args.link) if args.aggregation == "auto" else None
    return ExchangeConfig(aggregation=args.aggregation, codec=args.codec,
                          cache=None if args.cache == "none" else args.cache,
                          pipeline=None if args.pipeline == "sync" else args.pipeline,
                          sampling=args.sampling, overlap=args.overlap,
                          step_aside=args.step_aside, duplex=args.duplex, link=link)


def _train_link(value: Optional[str]):
    r"""``train --link``: ``None``, ``"calibrate"`` or the :class:`LinkModel` in a file."""
    if value is None or value == "calibrate":
        return value
    from .planner.link import LinkModel
    return LinkModel.load(value)


def _median_step(callbacks, name: str = "comm/step_s") -> Optional[float]:
    steps = [h[name] for h in callbacks[0].history if name in h] if callbacks else []
    return round(sorted(steps)[len(steps) // 2], 5) if steps else None


def _per_epoch(callbacks) -> Optional[Dict[str, list]]:
    if not callbacks:
        return None
    history = callbacks[0].history
    return {name: [h.get(f"comm/{name}") for h in history]
            for name in ("step_s", "exchange_s", "sent_MB", "predicted_step_exchange_s",
                         "predicted_step_codec_s", "predicted_step_exposed_s",
                         "predicted_step_link_s")}


def _print_summary(s: dict) -> None:
    def fmt(v, unit=""):
        return "n/a" if v is None else (f"{v:.4f}{unit}" if isinstance(v, float) else f"{v}{unit}")
    print()
    print(f"== {s['model'].upper()} on {s['dataset']}: {s['processes']} process(es), "
          f"{s['epochs']} epochs, strategy {s['strategy']} ==")
    print(f"test accuracy        {s['test_acc'] * 100:.2f} %")
    print(f"val accuracy         {s['val_acc'] * 100:.2f} %")
    step = s["train_step_seconds"]
    print(f"training time        {s['fit_seconds']:.1f} s in fit (start-up and validation included)"
          + ("" if step is None else f"; training step {step * 1000:.1f} ms (median, rank 0)"))
    if s["comm_MB_per_epoch_per_rank"] is not None:
        print(f"halo traffic         {fmt(s['comm_MB_per_epoch_per_rank'], ' MB')} sent per rank "
              f"per epoch (max rank {fmt(s['comm_MB_per_epoch_max_rank'], ' MB')})")
        print(f"exchange / compute   {fmt(s['exchange_s_per_epoch'], ' s')} / "
              f"{fmt(s['compute_s_per_epoch'], ' s')} per epoch (mean over the run and ranks)")
    if s.get("rows_skipped_frac") is not None:
        print(f"halo cache           {s['cache']}: {100 * s['rows_skipped_frac']:.1f} % of the "
              "rows and gradients served from the receivers' copies (mean over the run)")
    if s.get("codec") not in (None, "fp32"):
        print(f"wire format          {s['codec']}: {fmt(s['bits_mean'])} bits per feature on "
              f"average, {fmt(s['bits_last'])} in the last epoch (lossy: not the "
              "single-process result)")
    choices = s.get("aggregation_choices")
    if choices:
        print("aggregation auto     " + ", ".join(f"{layer} {c['mode']}"
                                                  for layer, c in choices.items()))
    aside = s.get("step_aside")
    if aside is not None:
        times = ", ".join(f"{'+'.join(arm) or 'exact post'} "
                          + (f"{t:.3f} s" if t is not None else "not timed")
                          for arm, t in zip(aside["arms"], aside["seconds"]))
        print(f"step aside           kept {', '.join(aside['stages']) or 'nothing (exact post)'} "
              f"(median step of each trial: {times})")


# Errors every rank raises identically: printed by rank 0 only.
def _same_on_every_rank(error: BaseException) -> bool:
    from .compat import UntestedVersionError
    from .data import GraphValidationError
    from .engine import SparseAdjacencyError, UnsupportedLayerError
    from .partition import PartitionMismatchError, StalePartitionError
    if isinstance(error, StalePartitionError):
        # Found in one rank's own part file (a part copied from another graph's partition):
        # only that rank knows, so that rank says it.
        return False
    return isinstance(error, (GraphValidationError, PartitionMismatchError,
                              UnsupportedLayerError, SparseAdjacencyError,
                              UntestedVersionError))


def _rank() -> int:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    # Before the process group exists: torchrun sets RANK, Lightning's launcher LOCAL_RANK.
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0)))


def _report(command: str, error: BaseException) -> None:
    r"""Prints an error once: the rank that caused it says why, the others stay quiet."""
    from .engine.errors import is_peer_failure
    rank = _rank()
    prefix = f"lightning-fullgraph {command}: error"
    if is_peer_failure(error):
        # A consequence: the failing rank prints the cause.
        if rank == 0:
            print(f"{prefix}: stopped because another rank failed (its error is printed "
                  "above or in its log)", file=sys.stderr)
        return
    if rank != 0 and _same_on_every_rank(error):
        return
    where = f" (rank {rank})" if rank != 0 or os.environ.get("WORLD_SIZE", "1") != "1" else ""
    notes = "".join(f"\n  {note}" for note in getattr(error, "__notes__", ()))
    print(f"{prefix}{where}: {error}{notes}", file=sys.stderr)


#: Exit status of a run stopped by SIGTERM: 128 + 15, as a shell reports a process the
#: signal ended (Lightning's own SIGTERMException is a SystemExit with status 0).
SIGTERM_EXIT = 143


def _is_sigterm(error: SystemExit) -> bool:
    if "lightning.pytorch" not in sys.modules:  # only a Trainer raises it
        return False
    from lightning.pytorch.utilities.exceptions import SIGTERMException
    return isinstance(error, SIGTERMException)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "train":
        _check_train_options(args)
    try:
        return {"partition": _partition, "train": _train, "plan": _plan}[args.command](args)
    except SystemExit as e:
        if not _is_sigterm(e):
            raise
        # Every rank stopped at the same step (FullGraphStrategy's deferred SIGTERM, or
        # Lightning's): nothing was tested or reported, which a status of 0 would hide.
        if _rank() == 0:
            print(f"lightning-fullgraph {args.command}: stopped by SIGTERM before the run "
                  "finished; no result", file=sys.stderr, flush=True)
        return SIGTERM_EXIT
    except (ValueError, RuntimeError, OSError, TypeError, ImportError, IndexError) as e:
        if os.environ.get("LIGHTNING_FULLGRAPH_DEBUG"):
            raise
        _report(args.command, e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
