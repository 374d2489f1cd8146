"""Board profiles recognised from their own data (edgecap/data/boards/*.json), on fake device trees."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Optional, Sequence

import pytest

from edgecap import devices, recognition
from edgecap.errors import ConfigError
from test_devices import _fake_tree

LOADED, DFU = ("18d1", "9302"), ("1a6e", "089a")
PHANBELL, PHANBELL_MAINLINE = "Freescale i.MX8MQ Phanbell", "Google i.MX8MQ Phanbell"
PI3, PI4, PI400, PI5 = ("Raspberry Pi 3 Model B Plus Rev 1.3", "Raspberry Pi 4 Model B Rev 1.4",
                        "Raspberry Pi 400 Rev 1.0", "Raspberry Pi 5 Model B Rev 1.0")
MINI = ("mediatek,mt8167-coral-mini", "mediatek,mt8167")


def _hw(tmp_path: Path, model: Optional[str] = None, pci: int = 0, usb: Sequence = (),
        compatible: Sequence[str] = ()) -> devices.Hardware:
    """A fake machine: ``usb`` lists each USB TPU as a speed in Mbit/s (a loaded TPU), None (its
    speed unknown) or "dfu" (still in its bootloader)."""
    ports = {f"1-{i}": (DFU if s == "dfu" else LOADED + ((s,) if s is not None else ()))
             for i, s in enumerate(usb, 1)}
    return devices.detect_hardware(_fake_tree(tmp_path / "root", ports, {n: 40000 for n in range(pci)},
                                              model, compatible=compatible))


# Each shipped profile on the hardware it is for; each "nearest" mapping; what no profile fits.
@pytest.mark.parametrize("model,compatible,pci,usb,profile,board", [
    (PHANBELL, (), 1, (), "devboard", "Coral Dev Board"),
    (PHANBELL_MAINLINE, (), 1, (), "devboard", "Coral Dev Board"),
    (PHANBELL, (), 1, (5000,), "devboard-usb", "Coral Dev Board"),
    (PHANBELL, (), 1, (None,), "devboard-usb", "Coral Dev Board"),  # speed unknown: not held against it
    (PHANBELL, (), 1, (480,), "devboard", "Coral Dev Board"),  # a USB 2 accelerator: the PCIe TPU's plans
    (PI4, (), 0, (5000, 5000), "rpi4-2usb", "Raspberry Pi 4"),
    (PI4, (), 0, (5000,), "rpi4-2usb", "Raspberry Pi 4"),
    (PI400, (), 0, (5000,), "rpi4-2usb", "Raspberry Pi 4"),
    (None, ("raspberrypi,4-model-b", "brcm,bcm2711"), 0, (5000,), "rpi4-2usb", "Raspberry Pi 4"),
    (PI4, (), 0, (5000, 480), None, "Raspberry Pi 4"),  # one on a USB 2 port: not priced
    (PI4, (), 0, ("dfu", 5000), "rpi4-2usb", "Raspberry Pi 4"),  # the bootloader's speed is not the link's
    (PI4, (), 0, (), None, "Raspberry Pi 4"),
    (PI5, (), 2, (), "rpi5-dualtpu", "Raspberry Pi 5"),
    (PI5, ("raspberrypi,5-model-b", "brcm,bcm2712"), 1, (), "rpi5-dualtpu", "Raspberry Pi 5"),
    (PI5, (), 0, (5000,), "rpi4-2usb", "Raspberry Pi 5"),  # nearest
    (PI5, (), 3, (), None, "Raspberry Pi 5"),
    (PI5, (), 2, (5000,), None, "Raspberry Pi 5"),
    (PI3, (), 0, (480,), "rpi3bplus-usb2", "Raspberry Pi 3 Model B+"),
    ("Raspberry Pi 3 Model B+", (), 0, (None,), "rpi3bplus-usb2", "Raspberry Pi 3 Model B+"),
    (None, MINI, 0, (480,), "rpi3bplus-usb2", "Coral Dev Board Mini"),  # nearest
    (None, (), 4, (), "pc-4tpu-pcie", None),
    (None, (), 1, (), "pc-4tpu-pcie", None),
    (None, (), 0, (5000,), None, None),  # a PC with a USB Accelerator: no profile ships for it
    (None, (), 5, (), None, None),
    ("Some other ARM board", (), 1, (), None, None),
])
def test_each_profile_is_recognised_from_its_own_rules(tmp_path, model, compatible, pci, usb, profile, board):
    hw = _hw(tmp_path, model, pci, usb, compatible)
    assert (hw.profile, hw.family) == (profile, board)


def test_a_board_mapped_to_the_nearest_profile_warns_once(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        hw = _hw(tmp_path, None, 0, (480,), MINI)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "Coral Dev Board Mini" in warning and "rpi3bplus-usb2" in warning and "\n" not in warning
    assert hw.recognised.nearest and hw.recognised.board == "Coral Dev Board Mini"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgecap"):
        assert _hw(tmp_path / "pi5", PI5, 2).recognised.nearest is None
    assert not caplog.records


def test_where_two_rules_match_the_most_specific_wins(tmp_path) -> None:
    hw = _hw(tmp_path, PHANBELL, 1, (5000,))
    held = [p for p, r in recognition.load_rules() if recognition.matches(r, hw.model, hw.compatible, hw.tpus)]
    assert sorted(held) == ["devboard", "devboard-usb"] and hw.profile == "devboard-usb"


def _tpus(pci: int, speeds: Sequence) -> list:
    return ([SimpleNamespace(kind="pci", state=None, speed_mbps=None)] * pci
            + [SimpleNamespace(kind="usb", state="dfu" if s == "dfu" else "loaded",
                               speed_mbps=None if s == "dfu" else s) for s in speeds])


def test_no_two_shipped_rules_tie_on_any_machine() -> None:
    rules = recognition.load_rules()
    boards = [(PHANBELL, ()), (PI3, ()), (PI4, ()), (PI5, ()), (None, MINI), (None, ()), ("Other", ())]
    speeds = [480, 5000, None, "dfu"]
    checked = 0
    for (model, compatible), pci, n_usb in itertools.product(boards, range(6), range(4)):
        for usb in itertools.combinations_with_replacement(speeds, n_usb):
            tpus = _tpus(pci, usb)
            held = [recognition.specificity(r) for _, r in rules if recognition.matches(r, model, compatible, tpus)]
            assert len(held) == len(set(held)), (model, compatible, pci, usb)
            checked += 1
    assert checked > 1000


def test_every_shipped_profile_but_the_build_host_has_recognition_rules() -> None:
    from edgecap_compile.boards import board_names

    assert {p for p, _ in recognition.load_rules()} == set(board_names()) - {"host"}


def _rules_file(tmp_path: Path, doc: dict, name: str = "x") -> Path:
    (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    recognition.load_rules.cache_clear()
    return tmp_path


@pytest.mark.parametrize("rule,message", [
    ({"board": "B", "source": "s"}, "give the board's device-tree model or compatible"),
    ({"board": "B", "source": "s", "model": "x", "no_device_tree": True}, "not both or neither"),
    ({"board": "B", "source": "s", "model": "(["}, r"rules\[0\].model: '\(\[' is not a regular expression"),
    ({"board": "B", "source": "s", "model": "x", "pci": {"min": 2, "max": 1}}, "pci: max 1 is below min 2"),
    ({"board": "B", "source": "s", "model": "x", "usb": {"min": -1}}, r"rules\[0\].usb.min"),
    ({"board": "B", "source": "s", "model": "x", "speed": 1}, "rules\\[0\\].speed' is unknown"),
])
def test_a_malformed_rule_is_one_line_naming_the_file_and_field(tmp_path, rule, message) -> None:
    root = _rules_file(tmp_path, {"profile": "x", "about": "a", "rules": [rule]})
    with pytest.raises(ConfigError, match=message) as err:
        recognition.load_rules(root)
    assert str(tmp_path / "x.json") in str(err.value) and "\n" not in str(err.value)


def test_a_file_names_its_own_profile(tmp_path) -> None:
    root = _rules_file(tmp_path, {"profile": "y", "about": "a", "rules": [
        {"board": "B", "source": "s", "model": "x"}]})
    with pytest.raises(ConfigError, match="profile 'y' is not the file's name"):
        recognition.load_rules(root)


def test_a_profile_added_as_a_file_registers_itself(tmp_path) -> None:
    root = _rules_file(tmp_path, {"profile": "my-board", "about": "a", "rules": [
        {"board": "My board", "source": "s", "compatible": ["acme,board"], "usb": {"min": 1}}]},
        name="my-board")
    rules = recognition.load_rules(root)
    found = recognition.recognise(None, ("acme,board",), _tpus(0, [5000]), rules)
    assert (found.profile, found.board) == ("my-board", "My board")
    assert recognition.recognise(None, ("acme,board",), [], rules) is None
