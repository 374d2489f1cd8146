"""The link kinds an EdgeTPU sits behind (``data/links.json``), read once for the runtime and the compiler.

Each kind's physical line rate bounds any rate a board profile or a
measurement may claim for it; its usable rate is what a link of that kind
carries when nothing better is known (a profile without a fit of its own, an
emulated device whose truth puts it on that link).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Dict

import msgspec

from edgecap import schema
from edgecap.errors import ConfigError

LINKS = Path(__file__).parent / "data" / "links.json"


class _LinkDoc(msgspec.Struct, forbid_unknown_fields=True):
    line_bytes_per_s: schema.Rate
    usable_bytes_per_s: schema.Rate
    source: str


class _LinksDoc(msgspec.Struct, forbid_unknown_fields=True):
    version: schema.Positive
    links: Dict[schema.Name, _LinkDoc]
    description: str = ""


@dataclass(frozen=True)
class LinkKind:
    """A kind of host link an EdgeTPU sits behind.

    Attributes:
      name: ``pcie``, ``pcie3``, ``usb3``, ``usb2``, ...
      line_bytes_per_s: Physical line rate, one direction: no link rate may exceed it.
      usable_bytes_per_s: The rate a link of this kind carries when nothing better is known.
      source: Where both figures come from.
    """

    name: str
    line_bytes_per_s: float
    usable_bytes_per_s: float
    source: str


@functools.lru_cache(maxsize=None)
def link_kinds(path: Path = LINKS) -> Dict[str, LinkKind]:
    """Returns the link kinds by name (read once per file).

    Raises:
      ConfigError: If the file is missing or malformed, or a usable rate exceeds its line rate.
    """
    doc = schema.read_file(path, _LinksDoc, error=ConfigError, what="link table",
                           fix="reinstall edgecap")
    for name, k in doc.links.items():
        if k.usable_bytes_per_s > k.line_bytes_per_s:
            raise ConfigError(f"{path}: links.{name}.usable_bytes_per_s {k.usable_bytes_per_s:g} "
                              f"exceeds line_bytes_per_s {k.line_bytes_per_s:g}; a link cannot "
                              "carry more than its line rate")
    return {name: LinkKind(name, k.line_bytes_per_s, k.usable_bytes_per_s, k.source)
            for name, k in doc.links.items()}
