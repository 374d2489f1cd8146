"""COCO's 80 object words, their plurals, and the sentences the real-world bundle says.

Pure Python: the sentence template, the vocabulary and the noun reader are
shared by the recipe (``models.coco_bundle``), the template decoder and the
benchmark (``models.real_bench``), and tested in the default suite.

A sentence names the (at most three most confident) objects seen, in COCO's
class order, with counts, then, after ``;``, how the main (most confident)
object moved across the window:
``two people and a bicycle ; a person moves left``. A window with nothing
found says ``nothing I know``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

# The 80 COCO detection categories, in the order detectors trained on COCO emit them.
CLASSES: Tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange",
    "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant",
    "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cell phone",
    "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors",
    "teddy bear", "hair drier", "toothbrush",
)
_IRREGULAR = {"person": "people", "mouse": "mice", "knife": "knives", "skis": "skis",
              "sheep": "sheep", "scissors": "scissors", "broccoli": "broccoli"}
COUNT_WORDS = ("", "a", "two", "three", "four")  # index = count; more than four is "many"
MOTIONS = ("left", "right", "up", "down")
NOTHING = "nothing I know"


def plural(name: str) -> str:
    """Returns the plural of a COCO category name ("person" -> "people", "bus" -> "buses")."""
    if name in _IRREGULAR:
        return _IRREGULAR[name]
    head, _, last = name.rpartition(" ")
    if last in _IRREGULAR:
        word = _IRREGULAR[last]
    elif re.search(r"(s|x|ch|sh)$", last):
        word = last + "es"
    else:
        word = last + "s"
    return f"{head} {word}".strip()


def article(name: str) -> str:
    """Returns "an" before a vowel sound, else "a"."""
    return "an" if name[0] in "aeio" or name.startswith("umbrella") else "a"


# Names that are plural in form are counted in pairs: "a pair of skis", "two pairs of scissors".
_PAIRS = ("skis", "scissors")


def one(name: str) -> str:
    """Returns one ``name`` with its article: "a bicycle", "an apple", "a pair of skis"."""
    return f"a pair of {name}" if name in _PAIRS else f"{article(name)} {name}"


def phrase(name: str, count: int) -> str:
    """Returns ``name`` with its count: "a bicycle", "an apple", "two people", "many cars", "two pairs of skis"."""
    if count <= 1:
        return one(name)
    many = COUNT_WORDS[count] if count < len(COUNT_WORDS) else "many"
    return f"{many} pairs of {name}" if name in _PAIRS else f"{many} {plural(name)}"


@dataclass(frozen=True)
class Scene:
    """What a window shows: objects with counts (most confident first) and the main object's motion.

    Attributes:
      objects: ``(class index, count)`` pairs.
      motion: One of ``MOTIONS`` for the first object, or None when it stays.
    """

    objects: Tuple[Tuple[int, int], ...]
    motion: Optional[str] = None


def sentence(scene: Scene, max_objects: int = 3) -> str:
    """Writes a scene as the bundle's sentence ("two people and a bicycle ; a person moves left")."""
    if not scene.objects:
        return NOTHING
    # Named in COCO's class order, not by score: the LSTM then scans the classes
    # it was shown instead of sorting them (sorted by score, it named the right
    # objects in 74% of made-up windows; docs/real-world.md).
    parts = [phrase(CLASSES[c], n) for c, n in sorted(scene.objects[:max_objects])]
    text = parts[0] if len(parts) == 1 else " ".join(parts[:-1]) + " and " + parts[-1]
    if scene.motion is not None:
        main = CLASSES[scene.objects[0][0]]
        text += f" ; {one(main)} moves {scene.motion}"
    return text


def vocabulary() -> List[str]:
    """Every word a sentence can hold (no special tokens), sorted."""
    words = {"and", ";", "moves", "many", "a", "an", "pair", "pairs", "of", *COUNT_WORDS[1:], *MOTIONS,
             *NOTHING.split()}
    for name in CLASSES:
        words.update(name.split())
        words.update(plural(name).split())
    words.discard("")
    return sorted(words)


def _noun_patterns() -> List[Tuple[re.Pattern, int]]:
    forms: List[Tuple[str, int]] = []
    for index, name in enumerate(CLASSES):
        for form in {name, plural(name)}:
            forms.append((form, index))
    forms.sort(key=lambda f: -len(f[0]))  # "hot dog" before "dog", "wine glass" before "glass"
    return [(re.compile(r"\b" + re.escape(form) + r"\b"), index) for form, index in forms]


_PATTERNS = _noun_patterns()


def nouns(text: str) -> Set[int]:
    """Returns the COCO classes a sentence names (singular or plural, exact COCO words).

    Longer names win where they overlap ("hot dog" is a hot dog, not a dog).
    """
    text = " " + text.lower() + " "
    found: Set[int] = set()
    for pattern, index in _PATTERNS:
        if pattern.search(text):
            found.add(index)
            text = pattern.sub(" # ", text)
    return found


def class_index() -> Dict[str, int]:
    """COCO category name -> index in ``CLASSES``."""
    return {name: i for i, name in enumerate(CLASSES)}
