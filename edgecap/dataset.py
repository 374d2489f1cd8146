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

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Union

import msgspec

from edgecap import schema
from edgecap.errors import ConfigError

try:
    from typing import Annotated
except ImportError:  # pragma: no cover - Python < 3.9 is not supported
    from typing_extensions import Annotated  # type: ignore[assignment]


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


class _OrientationDoc(msgspec.Struct, forbid_unknown_fields=True):
    period_deg: Annotated[float, msgspec.Meta(gt=0.0, le=360.0)]
    angles_deg: List[Annotated[float, msgspec.Meta(ge=-1e9, le=1e9)]]


class _IndexDoc(msgspec.Struct, forbid_unknown_fields=True):
    clips: Dict[schema.Name, List[str]]
    splits: Optional[Dict[schema.Name, List[schema.Name]]] = None
    fps: Optional[Annotated[float, msgspec.Meta(ge=0.0, le=10_000.0)]] = None
    orientation: Dict[schema.Name, _OrientationDoc] = {}


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
    if not path.exists():
        raise ConfigError(f"{path}: missing: a dataset directory holds captions.json and "
                          "clips/ (python -m models.dataset DIR writes one)")
    doc = schema.read_file(path, _IndexDoc, error=ConfigError,
                           fix="fix the malformed dataset index (layout: models/README.md)",
                           what="dataset index")
    captions = dict(doc.clips)
    splits = dict(doc.splits) if doc.splits is not None else {"test": list(captions)}
    orientation = {k: msgspec.structs.asdict(v) for k, v in doc.orientation.items()}
    for name, ids in splits.items():
        unknown = [cid for cid in ids if cid not in captions]
        if unknown:
            raise ConfigError(f"{path}: split '{name}' lists clip '{unknown[0]}' that \"clips\" "
                              "does not caption: add its captions or drop it from the split")
    return Dataset(root, captions, splits, doc.fps or None, orientation)
