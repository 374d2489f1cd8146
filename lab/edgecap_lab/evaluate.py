"""Caption quality of a bundle on a split: BLEU-4, CIDEr-D, exact match, int8/float agreement, confidence."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from edgecap.bundle import Bundle, load_bundle
from edgecap.captioner import Caption, EdgeCaptioner
from edgecap.dataset import read_dataset
from edgecap.errors import ConfigError, EdgecapError
from edgecap.limits import DEFAULT_BEAM
from edgecap.sources import VideoFileSource, sample


@dataclass
class Report:
    """Quality figures of one bundle on one split.

    Attributes:
      clips: Clips scored.
      bleu4: Corpus BLEU-4 (pycocoevalcap's Bleu scorer).
      cider_d: CIDEr-D (pycocoevalcap's Cider scorer).
      exact_match: Share of clips whose caption equals one of its references.
      agreement: Share of clips where the int8 and the float reference encoder
        give the same caption; None without a reference encoder.
      seconds: Wall time of the evaluation.
      beam: The decoder's beam width.
      confidence: Mean over the clips of the int8 caption's confidence
        (``Caption.confidence``).
      captions: Per clip: references, int8 caption, its confidence and float caption.
    """

    bundle: str
    data: str
    split: str
    clips: int
    bleu4: float
    cider_d: float
    exact_match: float
    agreement: Optional[float]
    seconds: float
    beam: int = DEFAULT_BEAM
    confidence: float = 0.0
    captions: Dict[str, Dict[str, object]] = field(default_factory=dict)


def _first_window(clip: Path, frames: int, sample_fps: float) -> List[np.ndarray]:
    # A clip is scored by its first window; the demo's clips are one window long.
    # Decoded once, it feeds the int8 and the float captioner alike.
    with VideoFileSource(clip) as src:
        window = [f.image for f in itertools.islice(sample(src, sample_fps), frames)]
    if len(window) < frames:
        raise EdgecapError(f"{clip}: shorter than one window of {frames} sampled frames")
    return window


def _norm(text: str) -> str:
    return " ".join(text.lower().replace(".", " ").split())


def _scorers() -> Tuple[Any, Any]:
    """pycocoevalcap's ``Bleu`` and ``Cider``, or the one line that says how to install them."""
    try:
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider
    except ImportError:
        raise ConfigError("edgecap eval scores with pycocoevalcap, which is not installed: "
                          "pip install pycocoevalcap") from None
    return Bleu, Cider


@dataclass(frozen=True)
class Scores:
    """Corpus scores of captions against references (``score``); ``exact``: clip id -> matched a reference."""

    bleu4: float
    cider_d: float
    exact_match: float
    exact: Dict[str, bool]


def score(references: Dict[str, List[str]], captions: Dict[str, str]) -> Scores:
    """Scores one caption per clip against the clip's references, as ``edgecap eval`` does.

    Args:
      references: Clip id -> its reference captions.
      captions: Clip id -> the caption to score (every id of ``references``).

    Returns:
      BLEU-4 and CIDEr-D (pycocoevalcap), the share of exact matches and which
      clips matched, after lower-casing and dropping full stops.

    Raises:
      ConfigError: If pycocoevalcap is not installed.
    """
    bleu_scorer, cider_scorer = _scorers()
    gts = {cid: [_norm(r) for r in refs] for cid, refs in references.items()}
    res = {cid: [_norm(captions[cid])] for cid in references}
    bleu, _ = bleu_scorer(4).compute_score(gts, res, verbose=0)
    cider, _ = cider_scorer().compute_score(gts, res)
    exact = {cid: res[cid][0] in gts[cid] for cid in gts}
    return Scores(float(bleu[3]), float(cider), sum(exact.values()) / len(exact), exact)


def evaluate(bundle: "str | os.PathLike[str] | Bundle", data_dir: "str | os.PathLike[str]",
             split: str = "test", limit: Optional[int] = None,
             progress: Optional[Callable[[int], object]] = None, beam: int = DEFAULT_BEAM) -> Report:
    """Captions every clip of a split and scores the captions against the references.

    Args:
      bundle: Bundle directory or loaded ``Bundle``.
      data_dir: Dataset directory (MSVD-like layout).
      split: Split to score.
      limit: Score only the first ``limit`` clips.
      progress: Called with 1 after each clip is captioned.
      beam: The decoder's beam width (``CaptionerOptions.beam``).

    Returns:
      The ``Report``.

    Raises:
      ConfigError: If the dataset is malformed, ``beam`` is out of range or
        pycocoevalcap is not installed.
    """
    _scorers()  # before any work
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit {limit}: must be at least 1")
    start = time.perf_counter()
    b = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
    data_dir = Path(data_dir)
    dataset = read_dataset(data_dir)
    refs = dataset.split(split)
    ids = list(refs)[:limit]
    if not ids:
        raise ConfigError(f"{data_dir}: split '{split}' has no clips")
    hyps: Dict[str, Caption] = {}
    floats: Optional[Dict[str, str]] = None if b.reference_encoder is None else {}
    with contextlib.ExitStack() as stack:
        cap = stack.enter_context(EdgeCaptioner(b, beam=beam))
        ref = (None if floats is None
               else stack.enter_context(EdgeCaptioner(b, reference_encoder=True, beam=beam)))
        for cid in ids:
            window = _first_window(dataset.clip_path(cid), cap.window.frames,
                                   cap.window.sample_fps)
            hyps[cid] = cap.caption_frames(window)[0]
            if ref is not None:
                floats[cid] = ref.caption_frames(window)[0].text
            if progress is not None:
                progress(1)

    scores = score({cid: refs[cid] for cid in ids}, {cid: hyps[cid].text for cid in ids})
    agree = None if floats is None else sum(floats[c] == hyps[c].text for c in ids) / len(ids)
    return Report(
        bundle=str(b.root), data=str(data_dir), split=split, clips=len(ids),
        bleu4=scores.bleu4, cider_d=scores.cider_d, exact_match=scores.exact_match, agreement=agree,
        seconds=time.perf_counter() - start, beam=beam,
        confidence=float(np.mean([hyps[cid].confidence for cid in ids])),
        captions={cid: {"references": refs[cid], "int8": hyps[cid].text,
                        "confidence": hyps[cid].confidence,
                        "float": None if floats is None else floats[cid]} for cid in ids},
    )


def format_report(r: Report) -> str:
    """Returns the report as a small text table."""
    rows = [("clips", str(r.clips)), ("BLEU-4", f"{r.bleu4:.3f}"), ("CIDEr-D", f"{r.cider_d:.3f}"),
            ("exact match", f"{r.exact_match:.1%}"),
            ("mean confidence", f"{r.confidence:.3g} (mean log-probability per token; beam {r.beam})"),
            ("int8/float agreement", "n/a (no reference_encoder)" if r.agreement is None
             else f"{r.agreement:.1%}"),
            ("seconds", f"{r.seconds:.1f}")]
    width = max(len(k) for k, _ in rows)
    head = f"{r.bundle} on {r.data} [{r.split}]"
    return "\n".join([head] + [f"  {k:<{width}}  {v}" for k, v in rows])


def report_json(r: Report) -> str:
    """Returns the report as JSON text."""
    return json.dumps(asdict(r), indent=2)
