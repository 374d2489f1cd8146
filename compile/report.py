"""The ``--report`` output: a table per stage and a picture of the split.

matplotlib is needed only for the picture (``pip install edgecap[plot]``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Union

import numpy as np

from edgecap.plans.plan import Plan
from edgecap_compile.cost_model import CostModel
from edgecap_compile.errors import CompileError
from edgecap_compile.partitioner import Partition


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024.0
    return f"{n:.2f} MiB"


def stage_table(plan: Plan) -> str:
    """Returns a markdown table of the plan's stages: device, op range, parameters vs SRAM,
    MACs, predicted ms and share of the bottleneck."""
    pred = plan.predicted
    bottleneck = pred.bottleneck_ms if pred else 0.0
    sram = plan.sram_bytes
    rows = ["| stage | device | ops | params on-chip / streamed | of SRAM | MACs | ms | "
            "of bottleneck |", "|---|---|---|---|---|---|---|---|"]
    for s in plan.stages:
        p = s.param_bytes
        used = (f"{100.0 * p.on_chip / sram:.0f}%"
                if sram and s.spec.kind != "cpu" else "-")
        ms = s.predicted_ms or 0.0
        share = 100.0 * ms / bottleneck if bottleneck else 0.0
        rows.append(
            f"| {s.index} | {s.device} | [{s.ops[0]}, {s.ops[1]}) | "
            f"{_size(p.on_chip)} / {_size(p.streamed)} | {used} | "
            f"{s.macs / 1e6:.1f} M | {ms:.3f} | {share:.0f}% |")
    if pred is not None:
        fps = f"{pred.fps:.1f}" if pred.fps else "-"
        rows.append("")
        rows.append(f"Predicted: {fps} fps, latency {pred.latency_ms:.3f} ms, bottleneck "
                    f"stage {pred.bottleneck_stage} at {pred.bottleneck_ms:.3f} ms"
                    + (f" (includes {plan.rnn_steps_per_frame:g} RNN step(s) a frame of "
                       f"{plan.rnn_ms:.3f} ms each on the CPU)" if plan.rnn_ms else ""))
    return "\n".join(rows)


def pyplot() -> Any:
    """Returns matplotlib's pyplot on the Agg backend (files only, no display).

    Raises:
      CompileError: If matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CompileError("--report draws split.png with matplotlib, which is not installed: "
                           "pip install 'edgecap[plot]'") from None
    return plt


def plot_split(model: CostModel, split: Partition, path: Union[str, os.PathLike]) -> None:
    """Draws each op's predicted time on its stage's device along the graph, cuts marked.

    Args:
      model: The cost model of the plan.
      split: The chosen partition.
      path: PNG file to write.
    """
    plt = pyplot()
    n = model.n_ops
    fig, (ax, params) = plt.subplots(2, 1, figsize=(11, 5.5), sharex=True,
                                     gridspec_kw={"height_ratios": [3, 1.4]})
    colors = plt.get_cmap("tab10")
    for k, (start, end) in enumerate(split.ranges):
        device = model.devices[k]
        color = colors(k % 10)
        if end > start:
            per_op = model.op_ms(k)[start:end]
            ax.bar(np.arange(start, end), per_op, width=0.9, color=color,
                   label=f"stage {k}: {device.name}, {split.stage_ms[k]:.2f} ms")
        else:
            ax.bar([], [], color=color, label=f"stage {k}: {device.name}, empty"
                   + (f" ({split.stage_ms[k]:.2f} ms RNN)" if split.stage_ms[k] else ""))
        stage_params = [model.param_bytes(start, i + 1) / 2**20 for i in range(start, end)]
        params.plot(np.arange(start, end), stage_params, color=color, drawstyle="steps-mid")
        if device.is_tpu:
            params.hlines(device.sram_bytes / 2**20, start - 0.5, max(end, start + 1) - 0.5,
                          colors=color, linestyles="dotted")
    for cut in split.cuts[1:-1]:
        for axis in (ax, params):
            axis.axvline(cut - 0.5, color="black", linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("op time on its device (ms)")
    ax.set_title(f"{model.graph.name}: bottleneck {split.bottleneck_ms:.2f} ms "
                 f"({1e3 / split.bottleneck_ms:.1f} fps), latency {split.latency_ms:.2f} ms")
    ax.legend(fontsize=8, loc="upper right")
    params.set_ylabel("stage params (MiB)\nvs SRAM (dotted)")
    params.set_xlabel("op index (execution order); dashed lines are cuts")
    params.set_xlim(-1, n)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=110)
    plt.close(fig)
