"""The cost model's validity: its predictions beside Coral's published whole-model latencies.

    python -m edgecap_lab.cost_model_validity                          # prints the table
    python -m edgecap_lab.cost_model_validity --out results/cost-model    # also writes the results

For every model of Coral's benchmark table (``data/coral_published.json``, each
figure with its source) and each of its columns (Dev Board TPU, the Dev Board's
embedded CPU, the USB Accelerator), predicts the latency with the board
profile's cost model and refits the column's coefficients with that model left
out (leave-one-out): the out-of-sample error is what "modelled" can claim
(except for the TPUs' usable SRAM budget, chosen by that same error over the
same models: the document says so).
Where the benchmark's cached int8 Keras model is the same architecture at the
same input (``graph`` in the data file: MobileNet v2), its graph gives the MACs,
element work, op count and parameter bytes; the other models have no graph
here, so their published MAC and parameter counts stand in, as one op with no
element work. On a TPU the parameters beyond the usable SRAM plus the input
image and 1001 class scores cross the link. A scan
over the usable SRAM budget shows which budget the published latencies support.
Prints the table; with ``--out PREFIX`` also writes PREFIX.md and PREFIX.json
(results/cost-model.md and .json are tracked: they are rewritten only when asked).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Dict, List, Optional, Sequence, Tuple

import msgspec
import numpy as np

from edgecap import schema
from edgecap.argtypes import Parser
from edgecap.command import run_command
from edgecap.outputs import check_output, write_text
from edgecap_compile.boards import PRICES, Device, link_kinds, load_board
from edgecap_compile.calibration import nonnegative_fit
from edgecap_compile.cost_model import work_features
from edgecap_compile.errors import CompileError

DATA = Path(__file__).parent / "data" / "coral_published.json"
# Coral's classifiers end in 1001 int8 class scores.
OUTPUT_BYTES = 1001
# Within this relative error out of sample a row meets the goal.
GOAL = 0.25
_NAMES = tuple(field for _, field in PRICES)


@dataclass(frozen=True)
class Column:
    """One latency column of Coral's table and the profile device that predicts it.

    Attributes:
      key: The column's field in the data file.
      board: Board profile holding the device.
      device: ``cpu`` or ``tpu:N``.
      fitted: The device fields a refit frees (the others keep the profile's values).
    """

    key: str
    board: str
    device: str
    fitted: Tuple[str, ...]


_TPU_FIT = ("macs_per_s", "invoke_overhead_ms", "link_bytes_per_s")
COLUMNS = (
    Column("devboard_tpu_ms", "devboard", "tpu:0", _TPU_FIT),
    Column("usb_tpu_ms", "devboard-usb", "tpu:1", _TPU_FIT),
    # The published figures cannot separate a CPU's overheads from its MAC rate.
    Column("embedded_cpu_ms", "devboard", "cpu", ("macs_per_s",)),
)


class Published(msgspec.Struct, forbid_unknown_fields=True):
    """One model of the published table."""

    name: str
    input: schema.Positive
    macs: schema.Rate
    params: Annotated[int, msgspec.Meta(ge=1, le=schema.MAX_BYTES)]
    devboard_tpu_ms: schema.Rate
    embedded_cpu_ms: schema.Rate
    usb_tpu_ms: schema.Rate
    counts_source: str
    note: str = ""
    # keras_zoo model of the same architecture and input, used when it is cached.
    graph: Optional[str] = None


class _Refit(msgspec.Struct, forbid_unknown_fields=True):
    profiles: List[str]
    field: str
    before: float
    after: float
    why: str


class _DataFile(msgspec.Struct):
    source: str
    table: str
    columns: Dict[str, str]
    models: List[Published]
    sram_reports: dict
    refits: List[_Refit] = []


def load_published(path: Path = DATA) -> _DataFile:
    """Reads the published figures.

    Raises:
      CompileError: If the file is missing or malformed.
    """
    return schema.read_file(path, _DataFile, error=CompileError, what="published figures",
                            fix="fix lab/edgecap_lab/data/coral_published.json")


@dataclass(frozen=True)
class Work:
    """What the cost model prices in a whole model.

    Attributes:
      macs: Multiply-accumulates.
      elements: Element work.
      ops: Op count.
      params: Parameter bytes.
      source: Where the figures come from (a graph file, or the published counts).
      memory: Bytes the ops move (parameters, plus activations where a graph gives them).
    """

    macs: float
    elements: float
    ops: int
    params: int
    source: str
    memory: float = 0.0


def published_work(model: Published) -> Work:
    """The published counts: one op, no element work, only the parameters as memory traffic."""
    return Work(model.macs, 0.0, 1, model.params, "published counts", float(model.params))


def model_work(model: Published) -> Work:
    """The model's graph when ``model.graph`` is cached (never generated here), else its published counts."""
    if model.graph is None:
        return published_work(model)
    from edgecap_compile.graph import read_graph
    from edgecap_lab.keras_zoo import model_path

    try:
        path = model_path(model.graph, generate=False)
    except FileNotFoundError:
        return published_work(model)
    ops = read_graph(path).ops
    return Work(float(sum(o.macs for o in ops)), float(sum(o.elements for o in ops)), len(ops),
                int(sum(o.param_bytes for o in ops)), f"graph {path.name}",
                float(sum(o.param_bytes + o.act_in_bytes + o.act_out_bytes for o in ops)))


def features(model: Published, device: Device, work: Optional[Work] = None) -> np.ndarray:
    """Returns the work features of a whole published model on ``device``.

    Args:
      model: The published model.
      device: The device.
      work: Its work (default: the published counts).

    Returns:
      ``work_features`` of the whole model: on a TPU its parameters beyond the
      usable SRAM plus the input image and the class scores cross the link.
    """
    work = work or published_work(model)
    link = 0
    if device.is_tpu:
        link = max(0, work.params - device.sram_bytes) + 3 * model.input ** 2 + OUTPUT_BYTES
    return work_features(work.macs, work.elements, work.ops, link, work.memory)


def fit(x: np.ndarray, y: np.ndarray, device: Device, fitted: Sequence[str]) -> Device:
    """Refits some of a device's coefficients to whole-model latencies.

    Args:
      x: Work features, one row per model.
      y: Published milliseconds.
      device: The profile's device; its other coefficients stay.
      fitted: Device fields to fit (``PRICES`` field names).

    Returns:
      The device with the fitted coefficients; a TPU's link rate is bounded by
      its link kind's line rate (``boards.link_kinds``).
    """
    prior = device.coefficients()
    free = [_NAMES.index(f) for f in fitted]
    c = _fit_free(x, y, prior, free)
    link = _NAMES.index("link_bytes_per_s")
    if device.link is not None and link in free:
        # A link rate above the line rate is no link: the bounded least squares
        # optimum then lies on the bound (one box constraint on a convex fit),
        # so the rate is fixed there and the other coefficients refitted.
        floor = 1e3 / link_kinds()[device.link].line_bytes_per_s
        if c[link] < floor:
            prior = prior.copy()
            prior[link] = floor
            c = _fit_free(x, y, prior, [j for j in free if j != link])
    return device.with_coefficients(c)


def _fit_free(x: np.ndarray, y: np.ndarray, prior: np.ndarray, free: List[int]) -> np.ndarray:
    # Non-negative fit of the free columns, the others kept at prior.
    fixed = [j for j in range(len(_NAMES)) if j not in free]
    target = y - x[:, fixed] @ prior[fixed]
    c, _ = nonnegative_fit(x, target, free, prior, relative_to=y)
    c[fixed] = prior[fixed]
    return c


def leave_one_out(x: np.ndarray, y: np.ndarray, device: Device,
                  fitted: Sequence[str]) -> np.ndarray:
    """Returns each row's prediction by a fit to all the other rows."""
    out = np.empty(len(y))
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        out[i] = float(x[i] @ fit(x[keep], y[keep], device, fitted).coefficients())
    return out


def _device(column: Column, sram: Optional[int] = None) -> Device:
    board = load_board(column.board)
    if sram is not None:
        board = board.with_sram(sram)
    return board.cpu if column.device == "cpu" else next(
        t for t in board.tpus if t.name == column.device)


def _fields(device: Device, fitted: Sequence[str]) -> Dict[str, float]:
    return {f: float(getattr(device, f)) for f in fitted}


def column_table(models: Sequence[Published], column: Column, sram: Optional[int] = None,
                 works: Optional[Sequence[Work]] = None) -> dict:
    """Predicts one column with its profile device, refits it, and scores it leave-one-out.

    Args:
      models: The published models.
      column: The column.
      sram: A usable SRAM budget in place of the profile's.
      works: Each model's work (default: the published counts).

    Returns:
      ``{"device", "profile", "refit", "rows"}``: the profile's and the refit's
      coefficients, and per model the published, profile and leave-one-out ms.
    """
    device = _device(column, sram)
    works = works or [published_work(m) for m in models]
    x = np.array([features(m, device, w) for m, w in zip(models, works)])
    y = np.array([getattr(m, column.key) for m in models], dtype=np.float64)
    profile = x @ device.coefficients()
    refit = fit(x, y, device, column.fitted)
    loo = leave_one_out(x, y, device, column.fitted)
    rows = [{"model": m.name, "features": works[i].source, "published_ms": float(y[i]), "profile_ms": round(float(profile[i]), 3),
             "profile_error": round(float(profile[i] / y[i] - 1), 4),
             "loo_ms": round(float(loo[i]), 3), "loo_error": round(float(loo[i] / y[i] - 1), 4)}
            for i, m in enumerate(models)]
    return {"column": column.key, "board": column.board, "device": column.device,
            "sram_usable_bytes": device.sram_bytes,
            "profile": _fields(device, column.fitted), "refit": _fields(refit, column.fitted),
            "rows": rows}


def sram_scan(models: Sequence[Published], budgets_mib: Sequence[float],
              works: Optional[Sequence[Work]] = None) -> List[dict]:
    """Returns, per usable SRAM budget, the worst leave-one-out error of each TPU column."""
    out = []
    for mib in budgets_mib:
        worst = {}
        for column in COLUMNS:
            if column.device != "cpu":
                table = column_table(models, column, int(mib * 2**20), works)
                worst[column.key] = max(abs(r["loo_error"]) for r in table["rows"])
        out.append({"sram_usable_mib": mib, "worst_loo_error": worst})
    return out


def validity(path: Path = DATA) -> dict:
    """Runs every column and the SRAM scan; returns the JSON document."""
    data = load_published(path)
    works = [model_work(m) for m in data.models]
    columns = [column_table(data.models, c, works=works) for c in COLUMNS]
    return {
        "command": "python -m edgecap_lab.cost_model_validity --out results/cost-model",
        "source": data.source,
        "goal": f"|leave-one-out error| <= {GOAL:.0%} on every row",
        "models": [msgspec.to_builtins(m) for m in data.models],
        "columns": columns,
        "sram_scan": sram_scan(data.models, [5.5, 5.75, 6.0, 6.25, 6.5, 7.0, 7.5, 8.0], works),
        "sram_reports": data.sram_reports,
        "refits": [msgspec.to_builtins(r) for r in data.refits],
    }


def _pct(e: float) -> str:
    return f"{100 * e:+.0f}%"


def _sram_caveat(doc: dict) -> str:
    """Says which TPU parameter the leave-one-out rows do not hold out."""
    mib = sorted({c["sram_usable_bytes"] / 2**20 for c in doc["columns"] if c["device"] != "cpu"})
    return ("One figure is not out of sample: the TPU columns' usable SRAM budget ("
            + " and ".join(f"{m:g}" for m in mib) + " MiB) was chosen as the budget with the "
            "smallest worst leave-one-out error over these same seven models (scan under *Usable "
            "SRAM budget*) and stays fixed when a model is left out, so the TPU columns' LOO "
            "errors are out of sample for the three refitted coefficients only, not for the "
            "budget, and are to that extent optimistic.")


def markdown(doc: dict) -> str:
    """Renders the validity document."""
    lines = [
        "# Cost model validity",
        "",
        f"`{doc['command']}`. Predicted (board profiles, compile/boards/*.json) vs Coral's "
        f"published whole-model latency ({doc['source']}), and the leave-one-out (LOO) "
        "prediction: the column's coefficients refitted to the other six models, then the "
        "model predicted. Goal: " + doc["goal"] + ". " + _sram_caveat(doc),
        "",
        "Features per model (column *features*): the graph of the benchmark's cached int8 "
        "Keras model where it is the same architecture at the same input (MobileNet v2: MACs, "
        "element work, op count, parameter bytes); otherwise Coral's table gives no graph here "
        "and the published MAC and parameter counts stand in (sources below), as one op with no "
        "element work. On a TPU the parameters beyond the usable SRAM plus the input image and "
        "1001 class scores cross the link. Fitted per column: TPU MAC rate, invoke overhead "
        "and link rate; CPU MAC rate only (its overheads stay the profile's). A TPU's link rate "
        "is bounded by its link kind's line rate (edgecap/data/links.json): the USB column's "
        "unbounded optimum (521 MB/s) was above USB 3.0's 500 MB/s, so its fit sits on the bound "
        "and the MAC rate and invoke overhead are refitted with it. On the CPU the bytes the ops "
        "move (parameters; activations too where a graph is cached) are priced at the profile's "
        "fixed memory bandwidth (cpu.memory_bytes_per_s) before the MAC rate is fitted.",
        "",
        "| model | column | features | published ms | profile ms | error | LOO ms | LOO error "
        "| within 25% |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    misses = []
    for col in doc["columns"]:
        for r in col["rows"]:
            ok = abs(r["loo_error"]) <= GOAL
            if not ok:
                misses.append(f"{r['model']} ({col['column']})")
            lines.append(f"| {r['model']} | {col['column']} ({col['board']} {col['device']}) | "
                         f"{r['features']} | {r['published_ms']:g} | {r['profile_ms']:.1f} | "
                         f"{_pct(r['profile_error'])} | {r['loo_ms']:.1f} | "
                         f"{_pct(r['loo_error'])} | {'yes' if ok else 'NO'} |")
    lines += ["", "Goal " + ("met on every row." if not misses else
                             f"missed on {len(misses)} rows: {', '.join(misses)}."), ""]
    lines += [f"- {m['name']}: {m['note']}." for m in doc["models"] if m["note"]]
    lines.append("")
    lines += ["## Coefficients", "",
              "| column | usable SRAM MiB | field | profile | refit to all seven |", "|---|---|---|---|---|"]
    for col in doc["columns"]:
        sram = ("-" if col["device"] == "cpu" else f"{col['sram_usable_bytes'] / 2**20:.2f}")
        for f, v in col["profile"].items():
            lines.append(f"| {col['column']} | {sram} | {f} | {v:.4g} | {col['refit'][f]:.4g} |")
    lines += ["", "## Usable SRAM budget", "",
              "Worst |LOO error| of the TPU columns when the usable parameter cache is set to:", "",
              "| usable MiB | " + " | ".join(doc["sram_scan"][0]["worst_loo_error"]) + " |",
              "|---|" + "---|" * len(doc["sram_scan"][0]["worst_loo_error"])]
    for s in doc["sram_scan"]:
        lines.append(f"| {s['sram_usable_mib']:g} | "
                     + " | ".join(f"{100 * e:.0f}%" for e in s["worst_loo_error"].values()) + " |")
    lines += ["", "edgetpu_compiler's own summaries (compiled bytes, larger than the .tflite's "
              "parameters):", "", "| issue | compiler | model MiB | on-chip MiB | off-chip MiB |",
              "|---|---|---|---|---|"]
    for r in doc["sram_reports"]["reports"]:
        lines.append(f"| {r['url']} | {r['compiler']} | {r['input_mib']} | {r['on_chip_mib']} | "
                     f"{r['off_chip_mib']} |")
    if doc["refits"]:
        lines += ["", "## What moved", "", "| profiles | field | before | after | why |",
                  "|---|---|---|---|---|"]
        for r in doc["refits"]:
            lines.append(f"| {', '.join(r['profiles'])} | {r['field']} | {r['before']:.4g} | "
                         f"{r['after']:.4g} | {r['why']} |")
    lines += ["", "## Sources of the counts", ""]
    lines += [f"- {m['name']} ({m['input']}x{m['input']}): {m['counts_source']}"
              for m in doc["models"]]
    lines.append("")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """Prints the table; with ``--out PREFIX`` also writes PREFIX.json and PREFIX.md."""
    parser = Parser(prog="python -m edgecap_lab.cost_model_validity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DATA), help="published figures (default: %(default)s)")
    parser.add_argument("-o", "--out",
                        help="also write PREFIX.json and PREFIX.md (the tracked ones: results/cost-model); "
                             "default: print only")
    args = parser.parse_args(argv)
    if args.out is not None:
        for suffix in (".json", ".md"):
            check_output(args.out + suffix, "--out")
    doc = validity(Path(args.data))
    text = markdown(doc)
    if args.out is not None:
        write_text(args.out + ".json", json.dumps(doc, indent=2) + "\n")
        write_text(args.out + ".md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_command("python -m edgecap_lab.cost_model_validity", main))
