"""The standard video-captioning corpora in their own formats: MSVD's CSV and MSR-VTT's JSON.

Each reader returns an ``edgecap.dataset.Dataset`` whose clips are the
corpus's video files, so the recipes (``models.train_frozen``) take a real
corpus as they take the synthetic one. Needs only the standard library and
``edgecap``.

MSVD (Microsoft Research Video Description Corpus, Chen and Dolan 2011):
``MSR Video Description Corpus.csv`` with the header
``VideoID,Start,End,WorkerID,Source,AnnotationTime,Language,Description``,
one row per description in any language; the clips are
``YouTubeClips/<VideoID>_<Start>_<End>.avi``. It has no split column: the
usual split (Venugopalan et al. 2015) takes the clips in the order they first
appear, 1200 for training, the next 100 for validation and the rest (670)
for test; a smaller copy is cut in the same proportions.

MSR-VTT (Xu et al. 2016): ``train_val_videodatainfo.json`` (or
``test_videodatainfo.json``) with ``videos: [{"video_id": "video0",
"split": "train", ...}]`` and ``sentences: [{"video_id", "caption",
"sen_id"}]``; the clips are ``<video_id>.mp4``. Its ``validate`` split is
read as ``val``.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

from edgecap import files
from edgecap.dataset import Dataset
from edgecap.errors import ConfigError

MSVD_COLUMNS = ("VideoID", "Start", "End", "WorkerID", "Source", "AnnotationTime", "Language",
                "Description")
# The usual MSVD split, in clips: train, val, then test takes the rest (670 of 1970).
MSVD_SPLIT = (1200, 100)
MSVD_CLIPS = 1970
MSRVTT_SPLITS = {"train": "train", "validate": "val", "val": "val", "test": "test"}
VIDEO_SUFFIXES = (".avi", ".mp4", ".webm", ".mkv", ".mov")


@dataclass
class CorpusDataset(Dataset):
    """A ``Dataset`` whose clips lie in a folder of the corpus's own video files.

    Attributes:
      videos: The folder (``YouTubeClips/`` for MSVD, ``TrainValVideo/`` for MSR-VTT).
      index: The annotation file it was read from.
    """

    videos: Path = Path(".")
    index: Path = Path(".")

    def clip_path(self, clip_id: str) -> Path:
        """Returns ``videos/<id>`` with the first video suffix that exists.

        Raises:
          ConfigError: If no file exists for the clip.
        """
        for suffix in VIDEO_SUFFIXES:
            path = self.videos / f"{clip_id}{suffix}"
            if path.is_file():
                return path
        raise ConfigError(f"{self.videos}: no video for clip '{clip_id}' listed in {self.index.name} "
                          f"(looked for {clip_id}{{{','.join(VIDEO_SUFFIXES)}}}): give the folder "
                          "that holds the corpus's clips (--videos)")


def _need_dir(videos: Path) -> Path:
    if not videos.is_dir():
        raise ConfigError(f"{videos}: no such folder (--videos): give the folder of the "
                          "corpus's video files")
    return videos


def msvd_split(ids: Sequence[str]) -> Dict[str, List[str]]:
    """Cuts clip ids, in first-appearance order, into the usual MSVD train/val/test split.

    The full corpus gets 1200/100/670; a subset gets the same proportions.
    """
    n = len(ids)
    scale = min(1.0, n / MSVD_CLIPS)
    train = round(MSVD_SPLIT[0] * scale) if n < MSVD_CLIPS else MSVD_SPLIT[0]
    val = round(MSVD_SPLIT[1] * scale) if n < MSVD_CLIPS else MSVD_SPLIT[1]
    return {"train": list(ids[:train]), "val": list(ids[train:train + val]),
            "test": list(ids[train + val:])}


def read_msvd(csv_path: Path, videos: Path, language: str = "English") -> CorpusDataset:
    """Reads MSVD's description CSV.

    Args:
      csv_path: ``MSR Video Description Corpus.csv``.
      videos: The folder of ``<VideoID>_<Start>_<End>.avi`` clips.
      language: Keep descriptions in this language (the ``Language`` column).

    Returns:
      The dataset: clip id ``<VideoID>_<Start>_<End>`` -> its descriptions,
      split as ``msvd_split`` says. Clips with no description in ``language``
      are left out.

    Raises:
      ConfigError: If the file is missing, is not that CSV, or holds no
        description in ``language``.
    """
    csv_path, videos = Path(csv_path), _need_dir(Path(videos))
    try:
        # Read whole and bounded: a FIFO or /dev/zero named as the CSV is one line, not a hang.
        data = files.read_bytes(csv_path, what="file", kind="text", error=ConfigError,
                                fix="give MSVD's 'MSR Video Description Corpus.csv'",
                                missing_fix="give MSVD's 'MSR Video Description Corpus.csv' (--msvd)")
        with io.StringIO(data.decode("utf-8"), newline="") as f:
            rows = csv.reader(f)
            header = tuple(next(rows, ()))
            if header[: len(MSVD_COLUMNS)] != MSVD_COLUMNS:
                raise ConfigError(f"{csv_path}: header {','.join(header)[:80]!r} is not MSVD's "
                                  f"({','.join(MSVD_COLUMNS)}): give the corpus's CSV")
            captions: Dict[str, List[str]] = {}
            for line, row in enumerate(rows, start=2):
                if not row:
                    continue
                if len(row) < len(MSVD_COLUMNS):
                    raise ConfigError(f"{csv_path}: line {line} has {len(row)} fields, not "
                                      f"{len(MSVD_COLUMNS)}: quote descriptions that hold commas")
                video, start, end, lang, text = row[0], row[1], row[2], row[6], row[7].strip()
                if lang != language or not text:
                    continue
                captions.setdefault(f"{video}_{start}_{end}", []).append(text)
    except (UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"{csv_path}: not a readable CSV ({e}): give MSVD's description CSV") from None
    if not captions:
        raise ConfigError(f"{csv_path}: no description in {language}: check --language")
    return CorpusDataset(csv_path.parent, captions, msvd_split(list(captions)), None,
                         videos=videos, index=csv_path)


def read_msrvtt(json_path: Path, videos: Path) -> CorpusDataset:
    """Reads MSR-VTT's ``*_videodatainfo.json``.

    Args:
      json_path: ``train_val_videodatainfo.json`` or ``test_videodatainfo.json``.
      videos: The folder of ``<video_id>.mp4`` clips.

    Returns:
      The dataset: video id -> its captions in ``sen_id`` order, split by each
      video's ``split`` (``validate`` read as ``val``). Videos without a
      caption are left out.

    Raises:
      ConfigError: If the file is missing or is not that JSON.
    """
    json_path, videos = Path(json_path), _need_dir(Path(videos))
    fix = "give MSR-VTT's train_val_videodatainfo.json"
    data = files.read_bytes(json_path, what="file", kind="json", error=ConfigError, fix=fix,
                            missing_fix=f"{fix} (--msrvtt)")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{json_path}: not valid JSON ({e}): {fix}") from None
    except RecursionError:  # nested deeper than the parser recurses
        raise ConfigError(f"{json_path}: not MSR-VTT's JSON (nested too deep to read): {fix}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("videos"), list) \
            or not isinstance(doc.get("sentences"), list):
        raise ConfigError(f"{json_path}: has no 'videos' and 'sentences' lists: {fix}")
    split_of: Dict[str, str] = {}
    for i, video in enumerate(doc["videos"]):
        if not isinstance(video, dict) or not isinstance(video.get("video_id"), str):
            raise ConfigError(f"{json_path}: videos[{i}] has no string 'video_id': {fix}")
        split = MSRVTT_SPLITS.get(str(video.get("split", "test")))
        if split is None:
            raise ConfigError(f"{json_path}: videos[{i}] has split {video.get('split')!r}: "
                              f"expected one of {', '.join(MSRVTT_SPLITS)}")
        split_of[video["video_id"]] = split
    ranked: Dict[str, List[tuple]] = {}
    for i, sentence in enumerate(doc["sentences"]):
        if not isinstance(sentence, dict) or not isinstance(sentence.get("caption"), str) \
                or sentence.get("video_id") not in split_of:
            raise ConfigError(f"{json_path}: sentences[{i}] needs a string 'caption' and a "
                              f"'video_id' listed in 'videos': {fix}")
        rank = sentence.get("sen_id", i)
        ranked.setdefault(sentence["video_id"], []).append((rank if isinstance(rank, int) else i,
                                                            sentence["caption"].strip()))
    captions = {vid: [text for _, text in sorted(ranked[vid])] for vid in split_of if vid in ranked}
    if not captions:
        raise ConfigError(f"{json_path}: no video has a caption: {fix}")
    splits: Dict[str, List[str]] = {"train": [], "val": [], "test": []}
    for vid in captions:
        splits[split_of[vid]].append(vid)
    return CorpusDataset(json_path.parent, captions, splits, None, videos=videos, index=json_path)
