"""Which board profile a machine is: each profile's recognition rules, read from ``data/boards/``.

A board profile's figures (its CPU and TPUs, priced by the compiler) live in
``compile/boards/<profile>.json``; how the profile is recognised lives in
``edgecap/data/boards/<profile>.json``, one file per profile, so that a board
reads it without the compiler (``edgecap_compile`` does not import on an
aarch64 board). A profile registers itself by its file: this module knows no
board by name. ``host`` has no recognition file: it is the build host's CPU,
never a board.

A file holds one or more rules; a rule matches a machine when all its
conditions hold:

* the device tree: ``model`` (a regular expression searched in
  ``/proc/device-tree/model``) or one of ``compatible`` (in the device tree's
  ``compatible`` list); or, with ``no_device_tree``, a machine without one (a PC);
* ``pci`` and ``usb``: how many EdgeTPUs of each kind, ``{"min": 1, "max": 2}``
  (``max`` absent: no upper bound; a kind not named: any number);
* ``usb_mbps``: the link speed of every USB EdgeTPU that runs its firmware
  (sysfs ``speed``, Mbit/s: 480 is USB 2, 5000 USB 3). A TPU still in its
  bootloader (1a6e:089a) or one whose speed does not read is not held against
  a rule.

A rule with ``nearest`` maps a board with no profile of its own to this one;
its text says why, and it is logged as one warning when it is picked.

Where several rules match, the most specific wins: the one that requires the
most EdgeTPUs (the sum of its ``min``s), then the one with the most bounded
conditions (a ``min`` above 0, a ``max``, a ``usb_mbps`` bound), then a
profile's own rule over a ``nearest`` one. Shipped rules never tie
(tests/test_recognition.py checks them over a grid of machines); a tie
between files a user added goes to the first profile by name.

This module imports only ``edgecap.schema`` and ``edgecap.errors``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import msgspec

from edgecap import schema
from edgecap.errors import ConfigError

RULES_DIR = Path(__file__).parent / "data" / "boards"
_FIX = "fix the board's recognition file (fields: edgecap/recognition.py)"


class Range(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """How many (or how fast): ``min`` inclusive, ``max`` inclusive or None for no bound."""

    min: schema.Count = 0
    max: Optional[schema.Count] = None

    def holds(self, value: int) -> bool:
        return value >= self.min and (self.max is None or value <= self.max)

    @property
    def bounds(self) -> int:
        return (self.min > 0) + (self.max is not None)


class Rule(msgspec.Struct, forbid_unknown_fields=True):
    """One way a profile is recognised (see the module docstring)."""

    board: schema.Name
    source: schema.Name
    model: Optional[str] = None
    compatible: List[schema.Name] = []
    no_device_tree: bool = False
    pci: Range = Range()
    usb: Range = Range()
    usb_mbps: Range = Range()
    nearest: Optional[schema.Name] = None


class _RulesFile(msgspec.Struct, forbid_unknown_fields=True):
    profile: schema.Name
    about: schema.Name
    rules: List[Rule]


@dataclass(frozen=True)
class Recognised:
    """The profile a machine was recognised as.

    Attributes:
      profile: The board profile's name, e.g. ``rpi5-dualtpu``.
      board: What the rule calls the machine, e.g. ``Raspberry Pi 5``.
      nearest: Why a board with no profile of its own runs this one, or None.
      rule: The rule that matched.
    """

    profile: str
    board: str
    nearest: Optional[str]
    rule: Rule


@lru_cache(maxsize=None)
def load_rules(directory: Path = RULES_DIR) -> Tuple[Tuple[str, Rule], ...]:
    """Reads every profile's recognition rules, as ``(profile, rule)`` in profile-name order.

    Raises:
      ConfigError: If a file is malformed, names another profile than its file
        name, has no rule, or a rule says nothing of the device tree or holds a
        pattern that does not compile: one line naming the file and the field.
    """
    found = []
    for path in sorted(directory.glob("*.json")):
        doc = schema.read_file(path, _RulesFile, what="board recognition file", fix=_FIX,
                               error=ConfigError)
        if doc.profile != path.stem:
            raise ConfigError(f"{path}: profile '{doc.profile}' is not the file's name; name the "
                              f"file {doc.profile}.json or the profile {path.stem}")
        if not doc.rules:
            raise ConfigError(f"{path}: rules is empty; give at least one way to recognise the board")
        for i, rule in enumerate(doc.rules):
            _check(rule, f"{path}: rules[{i}]")
            found.append((doc.profile, rule))
    return tuple(found)


def _check(rule: Rule, where: str) -> None:
    said = rule.model is not None or bool(rule.compatible)
    if said == rule.no_device_tree:
        raise ConfigError(f"{where}: give the board's device-tree model or compatible, or "
                          "no_device_tree for a machine without one, not both or neither")
    if rule.model is not None:
        try:
            re.compile(rule.model)
        except re.error as exc:
            raise ConfigError(f"{where}.model: {rule.model!r} is not a regular expression ({exc}); "
                              f"{_FIX}") from None
    for name, r in (("pci", rule.pci), ("usb", rule.usb), ("usb_mbps", rule.usb_mbps)):
        if r.max is not None and r.max < r.min:
            raise ConfigError(f"{where}.{name}: max {r.max} is below min {r.min}; {_FIX}")


def board_matches(rule: Rule, model: Optional[str], compatible: Sequence[str]) -> bool:
    """Whether the device-tree part of ``rule`` holds for this machine (its TPUs aside)."""
    if rule.no_device_tree:
        return model is None and not compatible
    return bool((rule.model is not None and model is not None and re.search(rule.model, model))
                or set(rule.compatible) & set(compatible))


def matches(rule: Rule, model: Optional[str], compatible: Sequence[str], tpus: Sequence[Any]) -> bool:
    """Whether ``rule`` holds for this machine.

    Args:
      rule: The rule.
      model: The device-tree model, or None.
      compatible: The device tree's ``compatible`` strings.
      tpus: The EdgeTPUs, each with ``kind`` (``pci``/``usb``), ``state``
        (``dfu`` before its firmware) and ``speed_mbps`` (None unknown).
    """
    if not board_matches(rule, model, compatible):
        return False
    if not rule.pci.holds(sum(1 for t in tpus if t.kind == "pci")):
        return False
    usb = [t for t in tpus if t.kind == "usb"]
    if not rule.usb.holds(len(usb)):
        return False
    speeds = [t.speed_mbps for t in usb if t.speed_mbps is not None and t.state != "dfu"]
    return all(rule.usb_mbps.holds(s) for s in speeds)


def specificity(rule: Rule) -> Tuple[int, int, int]:
    """The order among matching rules (higher wins; see the module docstring)."""
    bounded = rule.pci.bounds + rule.usb.bounds + rule.usb_mbps.bounds
    return rule.pci.min + rule.usb.min, bounded, rule.nearest is None


def recognise(model: Optional[str], compatible: Sequence[str], tpus: Sequence[Any],
              rules: Optional[Sequence[Tuple[str, Rule]]] = None) -> Optional[Recognised]:
    """Returns the profile this machine is recognised as, or None when no rule holds.

    Args:
      model, compatible, tpus: As for ``matches``.
      rules: ``(profile, rule)`` pairs (default: the shipped ``load_rules()``).
    """
    held = [(profile, rule) for profile, rule in (load_rules() if rules is None else rules)
            if matches(rule, model, compatible, tpus)]
    if not held:
        return None
    # max() keeps the first of equals: profile-name order breaks a tie.
    profile, rule = max(held, key=lambda pr: specificity(pr[1]))
    return Recognised(profile, rule.board, rule.nearest, rule)


def board_name(model: Optional[str], compatible: Sequence[str],
               rules: Optional[Sequence[Tuple[str, Rule]]] = None) -> Optional[str]:
    """What the rules call this machine by its device tree alone (TPUs aside), or None."""
    for _, rule in (load_rules() if rules is None else rules):
        if not rule.no_device_tree and board_matches(rule, model, compatible):
            return rule.board
    return None
