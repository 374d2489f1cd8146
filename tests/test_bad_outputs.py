"""Output paths: checked before a run, written whole or not at all (edgecap.outputs)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from edgecap.errors import ConfigError
from edgecap.outputs import atomic_path, check_output, write_text


def test_a_new_file_in_an_existing_directory_passes_and_leaves_nothing(tmp_path: Path) -> None:
    assert check_output(tmp_path / "out.json", "--json") == tmp_path / "out.json"
    assert os.listdir(tmp_path) == []  # the probe file is gone


def test_missing_parents_are_not_created(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no directory .*mkdir -p"):
        check_output(tmp_path / "a" / "b" / "out.json", "--json")
    assert os.listdir(tmp_path) == []


def test_an_output_folder_is_created_by_the_command_but_not_its_parent(tmp_path: Path) -> None:
    assert check_output(tmp_path / "plan", "-o", directory=True) == tmp_path / "plan"
    assert check_output(tmp_path, "-o", directory=True) == tmp_path  # an existing folder is filled
    with pytest.raises(ConfigError, match="no directory"):
        check_output(tmp_path / "a" / "plan", "-o", directory=True)


def test_a_device_is_written_in_place() -> None:
    assert check_output("/dev/null", "--json") == Path("/dev/null")
    with atomic_path("/dev/null") as target:
        assert target == Path("/dev/null")


def test_a_read_only_place_is_found_by_trying() -> None:
    # Root ignores permission bits; /sys refuses new files even to root.
    with pytest.raises(ConfigError, match=r"--json /sys/out\.json: cannot write in /sys"):
        check_output("/sys/out.json", "--json")


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    out.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_path(out) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("interrupted")
    assert out.read_text() == "old\n" and os.listdir(tmp_path) == ["results.json"]


def test_a_replaced_file_keeps_its_mode_and_a_new_one_follows_the_umask(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    out.write_text("old\n")
    out.chmod(0o640)
    write_text(out, "new\n")
    assert out.read_text() == "new\n" and stat.S_IMODE(out.stat().st_mode) == 0o640
    umask = os.umask(0o022)
    try:
        write_text(tmp_path / "fresh.json", "x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "fresh.json").stat().st_mode) == 0o644


def test_a_symbolic_link_is_written_through(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "results.json").write_text("old\n")
    link = tmp_path / "results.json"
    link.symlink_to(tmp_path / "real" / "results.json")
    check_output(link, "--json")
    write_text(link, "new\n")
    assert link.is_symlink() and (tmp_path / "real" / "results.json").read_text() == "new\n"
    assert sorted(os.listdir(tmp_path / "real")) == ["results.json"]
