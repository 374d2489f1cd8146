"""What the decoder's beam width does to caption quality, confidence and decode time, per model.

    python tools/beam_bench.py --data data/shapes2_eval --json results/beam-bench.json \
        --model demo=models/demo/bundle --model undertrained=data/undertrained

Each clip's first window (as ``edgecap eval`` takes it) goes through the
bundle's int8 encoder and RNN encoder step once; its final state is then
decoded at every width (``--widths``) and length penalty
(``--length-penalties``, which only matters from width 2), and the captions
are scored as ``edgecap eval`` scores them (``edgecap_lab.evaluate.score``). A
window's decode is timed on this host (measured: the median over the
windows, one thread, as the runtime's decode worker runs it) and priced on
the board's CPU (modelled: the decoder step model's cost at the board
profile's coefficients, as the compiler prices the RNN encoder step, times
the steps the search took; the numpy work between steps is not priced). It
prints a table and writes the figures as JSON; bad input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgecap.argtypes import Parser, int_in, int_list_in
from edgecap.bundle import Bundle, DEMO_DIR, load_bundle
from edgecap.command import run_command
from edgecap.dataset import read_dataset
from edgecap.errors import ConfigError, EdgecapError
from edgecap_lab.evaluate import score
from edgecap.interpreter import make_cpu_interpreter
from edgecap.limits import MAX_BEAM
from edgecap.outputs import check_output, write_text
from edgecap.preprocess import Preprocessor, dequantize
from edgecap.rnn import RnnDecoder, RnnEncoder, State
from edgecap.sources import VideoFileSource, sample

PROG = "python tools/beam_bench.py"
MAX_CLIPS = 100_000


@dataclass
class Row:
    """One model at one width and length penalty.

    Attributes:
      model: The model's name (``--model NAME=DIR``).
      beam: Beam width.
      length_penalty: Exponent of the length normalisation.
      clips: Windows decoded.
      exact_match: Share of captions equal to a reference.
      bleu4: Corpus BLEU-4.
      cider_d: CIDEr-D.
      confidence: Mean of the captions' confidence (mean log-probability per token).
      confidence_auc: How well confidence tells exact matches from misses: the
        chance that a random match is surer than a random miss (ties count
        half); None when all match or none does.
      changed: Share of captions that differ from the greedy (width 1) ones.
      steps: Mean decoder step invokes per window.
      host_ms: Median milliseconds of a window's decode on this host (measured).
      host_ms_mean: Mean of the same.
      board_ms: Milliseconds of a window's decode on the board's CPU (modelled).
    """

    model: str
    beam: int
    length_penalty: float
    clips: int
    exact_match: float
    bleu4: float
    cider_d: float
    confidence: float
    confidence_auc: Optional[float]
    changed: float
    steps: float
    host_ms: float
    host_ms_mean: float
    board_ms: float


def encoder_states(bundle: Bundle, clips: Sequence[Path]) -> List[State]:
    """Returns the RNN encoder's state after each clip's first window, as the runtime computes it.

    Raises:
      EdgecapError: If a clip is shorter than one window or cannot be read.
    """
    cnn = make_cpu_interpreter(bundle.encoder)
    (inp,), (out,) = cnn.get_input_details(), cnn.get_output_details()
    preprocess = Preprocessor(bundle.input, inp)
    encoder = RnnEncoder(bundle.encoder_step)
    states = []
    for clip in clips:
        with VideoFileSource(clip) as src:
            frames = [f.image for f in itertools.islice(sample(src, bundle.window.sample_fps),
                                                        bundle.window.frames)]
        if len(frames) < bundle.window.frames:
            raise EdgecapError(f"{clip}: shorter than one window of {bundle.window.frames} sampled frames")
        state = State.zeros(bundle.hidden_size)
        for image in frames:
            cnn.set_tensor(inp["index"], preprocess(image))
            cnn.invoke()
            state = encoder.step(dequantize(cnn.get_tensor(out["index"]), out), state)
        states.append(state)
    return states


def auc(positives: Sequence[float], negatives: Sequence[float]) -> Optional[float]:
    """The chance that a random positive scores above a random negative (ties half), or None."""
    if not positives or not negatives:
        return None
    p, n = np.asarray(positives)[:, None], np.asarray(negatives)[None, :]
    return float(np.mean((p > n) + 0.5 * (p == n)))


def board_step_ms(bundle: Bundle, board: str) -> float:
    """The decoder step's time on the board's CPU, as the compiler prices the RNN encoder step (modelled)."""
    try:
        from edgecap_compile.boards import load_board
        from edgecap_compile.compiler import rnn_step_ms
    except ImportError as e:
        raise EdgecapError(f"the compiler is not installed ({e}): pip install edgecap "
                           "from a source checkout") from None
    return rnn_step_ms(bundle.decoder_step, load_board(board))


def bench_model(name: str, bundle: Bundle, states: List[State], references: Dict[str, List[str]],
                widths: Sequence[int], penalties: Sequence[float], step_ms: float) -> List[Row]:
    """Decodes every state at every width and penalty; returns a row for each."""
    decoder = RnnDecoder(bundle.decoder_step, 1)
    tok = bundle.tokens
    ids = list(references)
    greedy: List[List[int]] = []  # the first width is 1 (main sees to it)
    rows = []
    settings = [(w, p) for w in widths for p in (penalties if w > 1 else penalties[:1])]
    for beam, penalty in settings:
        decoded, ms = [], []
        for state in states:
            start = time.perf_counter()
            decoded.append(decoder.decode(state, tok.bos, tok.eos, bundle.max_caption_length,
                                          beam, penalty))
            ms.append((time.perf_counter() - start) * 1e3)
        tokens = [d.tokens for d in decoded]
        greedy = tokens if beam == 1 else greedy
        scores = score(references, {cid: bundle.detokenize(t) for cid, t in zip(ids, tokens)})
        steps = float(np.mean([d.steps for d in decoded]))
        rows.append(Row(
            model=name, beam=beam, length_penalty=penalty, clips=len(ids),
            exact_match=scores.exact_match, bleu4=scores.bleu4, cider_d=scores.cider_d,
            confidence=float(np.mean([d.confidence for d in decoded])),
            confidence_auc=auc([d.confidence for d, cid in zip(decoded, ids) if scores.exact[cid]],
                               [d.confidence for d, cid in zip(decoded, ids) if not scores.exact[cid]]),
            changed=float(np.mean([a != b for a, b in zip(tokens, greedy)])),
            steps=steps, host_ms=float(np.median(ms)), host_ms_mean=float(np.mean(ms)),
            board_ms=steps * step_ms))
    return rows


def format_table(rows: Sequence[Row], board: str) -> str:
    """Returns the rows as a text table."""
    name = max([len("model")] + [len(r.model) for r in rows]) + 2
    head = (f"{'model':<{name}}{'beam':>5}{'alpha':>6}{'exact':>8}{'BLEU-4':>8}{'conf':>8}{'changed':>9}"
            f"{'AUC':>6}{'steps':>7}{'host ms':>9}{board + ' ms':>{max(len(board) + 4, 10)}}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.model:<{name}}{r.beam:>5}{r.length_penalty:>6g}{r.exact_match:>8.1%}{r.bleu4:>8.3f}"
                     f"{r.confidence:>8.3f}{r.changed:>9.1%}{_auc(r.confidence_auc):>6}{r.steps:>7.1f}{r.host_ms:>9.3f}"
                     f"{r.board_ms:>{max(len(board) + 4, 10)}.3f}")
    lines.append(f"host ms: measured here, median per window; {board} ms: modelled (decoder steps x "
                 "the board CPU's price of one step); alpha: length penalty (1 = mean log-probability); "
                 "AUC: how well confidence tells exact matches from misses")
    return "\n".join(lines)


def _auc(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def _model(text: str) -> Tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: use NAME=BUNDLE_DIR")
    return name, Path(path)


def _penalties(text: str) -> List[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(0.0 <= v <= 10.0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: use comma-separated numbers from 0 to 10")
    return values


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the beam benchmark from the command line.

    Args:
      argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
      The exit code: 0, or 2 on bad input.
    """
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=_model, action="append", metavar="NAME=DIR",
                        help="a bundle to measure, named (repeat; default: demo=the shipped demo)")
    parser.add_argument("--data", type=Path, required=True,
                        help="dataset directory (its --split clips are scored), e.g. data/shapes2_eval")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int_in(1, MAX_CLIPS), help="score only the first N clips")
    parser.add_argument("--widths", type=int_list_in(1, MAX_BEAM), default=[1, 2, 3, 5],
                        help="beam widths (default 1,2,3,5)")
    parser.add_argument("--length-penalties", type=_penalties, default=[1.0],
                        help="length penalties to try from width 2 (default 1: the mean)")
    parser.add_argument("--board", default="devboard", help="board profile whose CPU prices a step")
    parser.add_argument("--json", type=Path, help="write the results here")

    def body() -> int:
        args = parser.parse_args(argv)
        if args.json is not None:
            check_output(args.json, "--json")
        models = args.model or [("demo", DEMO_DIR / "bundle")]
        if len({n for n, _ in models}) != len(models):
            raise ConfigError("--model: give each model a name of its own")
        dataset = read_dataset(args.data)
        references = dict(itertools.islice(dataset.split(args.split).items(), args.limit))
        if not references:
            raise ConfigError(f"{args.data}: split '{args.split}' has no clips")
        widths = sorted(set(args.widths) | {1})  # greedy is what "changed" compares with
        before = os.getloadavg()
        rows: List[Row] = []
        about = {}
        for name, path in models:
            bundle = load_bundle(path)
            step_ms = board_step_ms(bundle, args.board)
            states = encoder_states(bundle, [dataset.clip_path(c) for c in references])
            rows += bench_model(name, bundle, states, references, widths, args.length_penalties, step_ms)
            provenance = json.loads((bundle.root / "bundle.json").read_text()).get("provenance", {})
            about[name] = {"bundle": str(path), "recipe": provenance.get("recipe"),
                           "vocab": len(bundle.vocab), "max_caption_length": bundle.max_caption_length,
                           "board_step_ms": step_ms}
        print(format_table(rows, args.board))
        if args.json is not None:
            figures = {"argv": sys.argv[1:],
                       "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                                "python": platform.python_version(),
                                "loadavg_before": list(before), "loadavg_after": list(os.getloadavg())},
                       "data": str(args.data), "split": args.split, "clips": len(references),
                       "board": args.board, "models": about, "rows": [asdict(r) for r in rows]}
            write_text(args.json, json.dumps(figures, indent=2) + "\n")
        return 0

    return run_command(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
