"""The captioned-clip dataset layout (MSVD-like) that evaluation and training read.

    DATA_DIR/clips/<id>.<ext>   any video OpenCV reads
    DATA_DIR/captions.json      {"clips": {id: [caption, ...]},
                                 "splits": {"train": [id, ...], "val": [...], "test": [...]},
                                 "fps": 16.0,
                                 "orientation": {id: {"period_deg": P, "angles_deg": [...]}}}

Only ``clips`` is required: without ``splits`` every clip is a test clip, without
``fps`` the rate comes from each file, and ``orientation`` is a training
annotation that only the synthetic generator writes (models/README.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Union

from edgecap.errors import ConfigError


@dataclass
class Dataset:
    """A captioned clip collection.

    Attributes:
      root: The dataset directory.
      captions: Clip id -> reference captions.
      splits: Split name -> clip ids.
      fps: Frame rate the clips were written at; None to take it from each file.
      orientation: Optional per-frame annotation, clip id -> ``{"period_deg": P,
        "angles_deg": [one per frame]}``: the outline's angle, meaningful modulo
        its symmetry period ``P``.
    """

    root: Path
    captions: Dict[str, List[str]]
    splits: Dict[str, List[str]]
    fps: Optional[float] = None
    orientation: Dict[str, dict] = field(default_factory=dict)

    def clip_path(self, clip_id: str) -> Path:
        """Returns the video file of ``clip_id`` (``clips/<id>.mp4``, else any extension).

        Raises:
          ConfigError: If no file exists for the clip.
        """
        mp4 = self.root / "clips" / f"{clip_id}.mp4"
        if mp4.is_file():
            return mp4
        others = sorted((self.root / "clips").glob(f"{clip_id}.*"))
        if not others:
            raise ConfigError(f"{self.root / 'clips'}: no file for clip '{clip_id}' listed in "
                              "captions.json: add the clip or drop it from the index")
        return others[0]

    def split(self, name: str) -> Dict[str, List[str]]:
        """Returns clip id -> references for the clips of split ``name``, in split order.

        Raises:
          ConfigError: If there is no such split.
        """
        if name not in self.splits:
            raise ConfigError(f"{self.root / 'captions.json'}: no split '{name}' "
                              f"(has {', '.join(sorted(self.splits)) or 'none'})")
        return {cid: self.captions[cid] for cid in self.splits[name]}


def read_dataset(root: Union[str, "os.PathLike[str]"]) -> Dataset:
    """Reads a dataset in the layout above.

    Args:
      root: Directory holding ``captions.json`` and ``clips/``.

    Returns:
      The ``Dataset``.

    Raises:
      ConfigError: If ``captions.json`` is missing or malformed, or a split names
        a clip that ``clips`` does not caption.
    """
    root = Path(root)
    path = root / "captions.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        captions = {str(k): [str(c) for c in v] for k, v in meta["clips"].items()}
        splits = {str(k): [str(c) for c in v]
                  for k, v in (meta.get("splits") or {"test": list(captions)}).items()}
        fps = float(meta["fps"]) if meta.get("fps") else None
        orientation = dict(meta.get("orientation") or {})
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing: a dataset directory holds captions.json and "
                          "clips/ (python -m models.dataset DIR writes one)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{path}: malformed dataset index ({e}): see models/README.md") from None
    for name, ids in splits.items():
        unknown = [cid for cid in ids if cid not in captions]
        if unknown:
            raise ConfigError(f"{path}: split '{name}' lists clip '{unknown[0]}' that \"clips\" "
                              "does not caption: add its captions or drop it from the split")
    return Dataset(root, captions, splits, fps, orientation)
