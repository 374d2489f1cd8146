"""edgecap's own state files are written whole, private, and never through a link (issue 28)."""

from __future__ import annotations

import os
import stat

import pytest

from edgecap import adapt, outputs
from edgecap.errors import ConfigError
Correction = adapt.Correction  # wherever the plan rooms keep it, adapt names it


def test_a_symlinked_corrections_file_is_not_written_through(tmp_path):
    # Before: save_corrections wrote through the link and replaced the file it pointed to.
    target = tmp_path / "elsewhere.txt"
    target.write_text("someone else's file\n")
    link = tmp_path / "corrections.json"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match=r"is a symbolic link; edgecap writes its state only to a plain file") as info:
        adapt.save_corrections(link, "devboard-usb", {"pci:0": Correction(2.0)}, {})
    assert "\n" not in str(info.value)
    assert target.read_text() == "someone else's file\n" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrections.json", "elsewhere.txt"]


def test_a_state_file_in_place_of_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "corrections.json")
    with pytest.raises(ConfigError, match="is not a regular file"):
        outputs.write_state(tmp_path / "corrections.json", "{}")


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_a_state_file_is_private_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        adapt.save_corrections(tmp_path / "corrections.json", "devboard-usb", {"pci:0": Correction(2.0)}, {})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "corrections.json").stat().st_mode) == 0o600
    assert adapt.load_corrections(tmp_path / "corrections.json", "devboard-usb") == {"pci:0": Correction(2.0)}
    assert [p.name for p in tmp_path.iterdir()] == ["corrections.json"]  # no temporary file left
