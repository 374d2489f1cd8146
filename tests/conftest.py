"""Shared fixtures: the shipped demo bundle is the fixture of record."""

from __future__ import annotations

import builtins
import os
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def shipped_bundle() -> Path:
    """The demo bundle under models/demo/bundle ($EDGECAP_TEST_BUNDLE runs the suite on another)."""
    path = Path(os.environ.get("EDGECAP_TEST_BUNDLE", REPO / "models" / "demo" / "bundle"))
    assert (path / "bundle.json").is_file(), f"no bundle at {path}"
    return path


@pytest.fixture
def bundle_copy(shipped_bundle: Path, tmp_path: Path) -> Path:
    """A private copy of the shipped bundle that a test may break."""
    dst = tmp_path / "bundle"
    shutil.copytree(shipped_bundle, dst)
    return dst


@pytest.fixture
def hide_module(monkeypatch):
    """Call with a top-level package name: importing it (or its submodules) then raises ImportError."""

    def hide(package: str) -> None:
        real_import = builtins.__import__

        def guarded(name, *args, **kwargs):
            if name == package or name.startswith(package + "."):
                raise ImportError(name)
            return real_import(name, *args, **kwargs)

        monkeypatch.setattr(builtins, "__import__", guarded)

    return hide


def write_noise_clip(path: Path, frames: int, size: int, fps: float = 16.0) -> Path:
    """Writes an mp4v clip of random BGR frames (a video that is valid but means nothing)."""
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (size, size))
    rng = np.random.default_rng(0)
    for _ in range(frames):
        w.write(rng.integers(0, 255, (size, size, 3), dtype=np.uint8))
    w.release()
    return path
