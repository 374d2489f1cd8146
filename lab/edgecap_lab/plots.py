"""Figures of runtime measurements: the bench bar chart and a trace timeline (needs matplotlib)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from edgecap.errors import ConfigError
from edgecap.outputs import atomic_path, check_output
from edgecap.trace import load_slices


def pyplot() -> Any:
    """Returns matplotlib's pyplot on the Agg backend (files only, no display).

    Raises:
      ConfigError: If matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install matplotlib") from None
    return plt


def check_plot(path: "str | os.PathLike[str]", what: str) -> Path:
    """Checks, before a run, that a figure can be written there: matplotlib, its format, the path.

    Args:
      path: The image to write; its suffix names the format (none: PNG).
      what: The option that named it, for the message, e.g. ``--plot``.

    Returns:
      ``path`` as a ``Path``.

    Raises:
      ConfigError: If matplotlib is missing, cannot write that format, or the
        path cannot be written (``outputs.check_output``).
    """
    plt = pyplot()
    target = Path(path)
    fmt = _format(target)
    supported = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    if fmt not in supported:
        raise ConfigError(f"{what} {target}: matplotlib cannot write .{fmt} files: "
                          "use .png, .svg or .pdf")
    return check_output(target, what)


def _format(path: Path) -> str:
    return path.suffix[1:].lower() or "png"


def _save(fig: Any, path: "str | os.PathLike[str]", dpi: int) -> None:
    # The temporary file's name does not tell matplotlib the format: the target's does.
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi, format=_format(Path(path)))
    except OSError as e:  # e.g. the disk is full
        raise ConfigError(f"{path}: cannot write ({e.strerror}); nothing was written") from None


def plot_bench(result: Dict[str, Any], path: "str | os.PathLike[str]") -> None:
    """Draws frames/s of every schedule, one panel per profile, speedups over the first row on the bars.

    Board panels (modelled) also draw the published figures of ``result["published"]``
    as lines; a panel whose rates span more than 20x has a log axis.

    Args:
      result: The JSON document ``edgecap bench --json`` writes.
      path: The PNG to write.
    """
    plt = pyplot()
    profiles = list(dict.fromkeys(r["profile"] for r in result["rows"]))
    cols = min(3, len(profiles))
    grid = -(-len(profiles) // cols)
    fig, axes = plt.subplots(grid, cols, figsize=(5.5 * cols, 4.4 * grid), squeeze=False)
    for ax in axes.flat[len(profiles):]:
        ax.set_visible(False)
    for ax, profile in zip(axes.flat, profiles):
        _bench_panel(ax, profile, [r for r in result["rows"] if r["profile"] == profile],
                     result.get("published", []))
    fig.suptitle("edgecap bench: a CPU only | b one TPU | e equal-parameter split, pipelined | "
                 "c placement | d pipeline", fontsize=9)
    fig.tight_layout()
    _save(fig, path, 120)
    plt.close(fig)


def _bench_panel(ax: Any, profile: str, rows: List[Dict[str, Any]], published: List[Dict[str, Any]]) -> None:
    """Draws one profile's bars, their speedups, the pipeline's bound and (a board's) the published figures."""
    names = [r["schedule"] for r in rows]
    fps = [r["fps"] for r in rows]
    bars = ax.bar(range(len(rows)), fps, color="#4c72b0")
    for bar, r in zip(bars, rows):
        ax.annotate(f"{r['speedup']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    bounds = [r["bound_fps"] for r in rows if r["schedule"].startswith("d") and r["bound_fps"]]
    lines = [(bounds[0], f"pipeline bound {bounds[0]:.0f} fps", "#c44e52", "--")] if bounds else []
    if profile != "host":
        lines += [(p["fps"], f"{p['label']}: {p['fps']:g} fps, {p['speedup']:g}x", "#55a868", ":")
                  for p in published]
    for y, label, color, style in lines:
        ax.axhline(y, color=color, linestyle=style, linewidth=1, label=label)
    if lines:
        ax.legend(loc="upper left", fontsize=7)
    top = max(fps + [y for y, *_ in lines])
    if min(fps) > 0 and top / min(fps) > 20:
        ax.set_yscale("log")
        ax.set_ylim(min(fps) / 2, top * 4)
    else:
        ax.set_ylim(0, 1.25 * top)
    ax.set_xticks(range(len(rows)), names, rotation=25, fontsize=7, ha="right")
    ax.set_ylabel("frames/s")
    ax.set_title(f"{profile} ({'measured' if profile == 'host' else 'modelled'})", fontsize=9)


def plot_timeline(
    trace: "str | os.PathLike[str]",
    path: "str | os.PathLike[str]",
    span_ms: float = 25.0,
    start_ms: Optional[float] = None,
) -> None:
    """Renders a stretch of a Chrome trace as a Perfetto-like timeline: a row per track.

    Args:
      trace: A trace written by ``Tracer.write``.
      path: The PNG to write.
      span_ms: Length of the stretch shown.
      start_ms: Where it starts (default: the middle of the run, past pipeline fill).
    """
    plt = pyplot()
    tracks = {name: s for name, s in load_slices(trace).items() if s}
    if not tracks:
        raise ConfigError(f"{trace}: no slices to draw: plot a trace of a run that captioned frames")
    first = min(s[0]["ts"] for s in tracks.values()) / 1000.0
    last = max(e["ts"] + e["dur"] for s in tracks.values() for e in s) / 1000.0
    t0 = start_ms if start_ms is not None else max(first, (first + last - span_ms) / 2)
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(tracks) + 1.2))
    names = list(tracks)
    for row, name in enumerate(names):
        for e in tracks[name]:
            start, dur = e["ts"] / 1000.0 - t0, e["dur"] / 1000.0
            if start + dur < 0 or start > span_ms:
                continue
            frame = e["args"]["frame"]
            ax.broken_barh([(start, dur)], (row - 0.4, 0.8), color=colors[frame % len(colors)],
                           edgecolor="black", linewidth=0.3)
            if dur > span_ms / 60:
                ax.text(start + dur / 2, row, str(frame), ha="center", va="center", fontsize=6,
                        clip_on=True)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, span_ms)
    ax.set_xlabel(f"ms (from {t0:.1f} ms into the run); slice colour and label = frame index")
    ax.grid(axis="x", linewidth=0.3)
    ax.set_title("edgecap pipelined run: one track per device, one slice per invoke")
    fig.tight_layout()
    _save(fig, path, 130)
    plt.close(fig)
