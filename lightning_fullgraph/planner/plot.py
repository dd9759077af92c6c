r"""The ``plan`` command's figure: bytes, exchange time and memory per rank against P.

Needs matplotlib, an optional dependency (``pip install lightning-fullgraph[plot]``).
"""
from pathlib import Path
from typing import Any, Dict, Union

__all__ = ["plot_sweep", "require_matplotlib", "PLOT_HINT"]

PLOT_HINT = "pip install 'lightning-fullgraph[plot]'"


def require_matplotlib() -> None:
    r"""Raises a clear :class:`ImportError` when matplotlib is missing.

    Raises:
        ImportError: Naming the ``plot`` extra to install.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError(f"plotting needs matplotlib, which is not installed: {PLOT_HINT} "
                          f"(or pip install matplotlib)") from e


def plot_sweep(result: Dict[str, Any], path: Union[str, Path]) -> Path:
    r"""Draws :func:`~.sweep.plan_sweep`'s result into an image file.

    Three panels, one line per aggregation mode: bytes sent per epoch by the busiest rank,
    predicted exchange seconds per epoch (when a link model was used) and estimated memory of
    the busiest rank, each against the number of parts.

    Args:
        result (Dict[str, Any]): The sweep.
        path (str or Path): Image file (PNG, SVG, PDF: by suffix); parent directories are
            created.

    Returns:
        Path: The file written.
    """
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = result["results"]
    parts = [e["parts"] for e in entries]
    modes = list(entries[0]["modes"]) if entries else []
    has_time = bool(entries) and all(
        s["exchange_seconds"] is not None for e in entries for s in e["modes"].values())
    panels = [("bytes_per_epoch_max", 1e6, "MB sent per epoch (busiest rank)")]
    if has_time:
        panels.append(("exchange_seconds", 1e-3, "exchange ms per epoch (predicted)"))
    panels.append(("memory_bytes_max", 1e6, "memory MB per rank (busiest, estimate)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8))
    axes = list(axes) if len(panels) > 1 else [axes]
    styles = {"post": ("o", "-"), "pre": ("s", "--"), "hybrid": ("^", "-.")}
    for ax, (key, scale, label) in zip(axes, panels):
        for mode in modes:
            ys = [e["modes"][mode][key] / scale for e in entries]
            marker, line = styles.get(mode, ("o", "-"))
            ax.plot(parts, ys, marker=marker, linestyle=line, label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xticks(parts)
        ax.set_xticklabels([str(p) for p in parts])
        ax.set_xlabel("parts (processes)")
        ax.set_title(label, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].legend(title="aggregation")
    m = result["model"]
    fig.suptitle(f"{result.get('dataset') or 'graph'}: {m['name'].upper()} hidden "
                 f"{m['hidden']} x {m['layers']} layers, one training step per epoch",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
