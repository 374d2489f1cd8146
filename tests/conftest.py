"""Shared fixtures: the shipped demo bundle is the fixture of record."""

from __future__ import annotations

import builtins
import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List

import cv2
import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


def pytest_collection_modifyitems(config, items) -> None:
    """Marks the fast tier's tests (tests/fast_tier.py) with ``fast``; a listed name that is gone is an error.

    A file named by node id (``pytest tests/test_x.py::test_y``) is collected
    only in part, so its listed names are checked only where it is collected whole.
    """
    from fast_tier import FAST_FILES, FAST_TESTS

    seen = set()
    for item in items:
        file = Path(str(item.fspath)).name
        name = getattr(item, "originalname", None) or item.name.split("[")[0]
        if file in FAST_FILES or name in FAST_TESTS.get(file, ()):
            item.add_marker(pytest.mark.fast)
            seen.add((file, name))
    partly = {Path(arg.split("::", 1)[0]).name for arg in config.args if "::" in arg}
    collected = {Path(str(item.fspath)).name for item in items} - partly
    here = Path(__file__).resolve().parent
    # A listed file that is gone (renamed) would drop out of the tier unnoticed.
    missing = sorted(f for f in set(FAST_FILES) | set(FAST_TESTS) if not (here / f).is_file())
    missing += [f"{file}::{name}" for file, names in FAST_TESTS.items() if file in collected
                for name in names if (file, name) not in seen]
    if missing:
        raise pytest.UsageError(f"tests/fast_tier.py lists tests that do not exist: {', '.join(missing)}; "
                                "update the list")


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory) -> Iterator[Path]:
    """Points $XDG_CACHE_HOME at a session temp dir, so no test writes plans into the user's cache.

    Set in ``os.environ`` rather than through monkeypatch (which is per test)
    so that it covers the whole session and the CLI subprocesses tests start.
    """
    cache = tmp_path_factory.mktemp("xdg-cache")
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    yield cache
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture(scope="session", autouse=True)
def private_state(tmp_path_factory) -> Iterator[Path]:
    """Points the service's state directory (the history) at a session temp dir, as ``private_cache`` does."""
    state = tmp_path_factory.mktemp("xdg-state")
    saved = {name: os.environ.pop(name, None) for name in ("XDG_STATE_HOME", "STATE_DIRECTORY")}
    os.environ["XDG_STATE_HOME"] = str(state)
    yield state
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def shipped_bundle() -> Path:
    """The demo bundle under models/demo/bundle ($EDGECAP_TEST_BUNDLE runs the suite on another)."""
    path = Path(os.environ.get("EDGECAP_TEST_BUNDLE", REPO / "models" / "demo" / "bundle"))
    assert (path / "bundle.json").is_file(), f"no bundle at {path}"
    return path


@pytest.fixture(scope="session")
def two_tpu_board(tmp_path_factory) -> str:
    """A board profile on which the demo CNN's plan uses both TPUs: devboard-usb with slower TPUs.

    Under the shipped profiles the tiny demo CNN fits one EdgeTPU, so tests of
    what happens when one of two TPUs fails need this one. Returned as a path
    (``EdgeCaptioner(board=...)`` and the compiler accept one); the demo's plan
    on it puts a segment on each TPU (``pci:0`` ops [0,9), ``usb:0`` [9,20),
    the CPU the rest, when written).
    """
    doc = json.loads((REPO / "compile" / "boards" / "devboard-usb.json").read_text())
    doc["name"] = "test-devboard-usb-slow-tpus"
    doc["description"] = "test only: devboard-usb with TPUs slowed to 4 G op/s, so the demo CNN spans both"
    for tpu in doc["tpus"]:
        tpu["macs_per_s"] = tpu["elements_per_s"] = 4e9
    # Pipelines only: copies of the whole CNN would beat the split here (issue 27), and
    # these tests are about one stage per TPU (tests/test_replicas_run.py runs copies).
    doc["replicas"] = False
    path = tmp_path_factory.mktemp("boards") / "test-devboard-usb-slow-tpus.json"
    path.write_text(json.dumps(doc, indent=2))
    return str(path)


@pytest.fixture
def bundle_copy(shipped_bundle: Path, tmp_path: Path) -> Path:
    """A private copy of the shipped bundle that a test may break."""
    dst = tmp_path / "bundle"
    shutil.copytree(shipped_bundle, dst)
    return dst


def pipeline_threads() -> list:
    """The edgecap worker, feeder and reader threads still alive."""
    return [t for t in threading.enumerate() if t.name.startswith("edgecap-")]


@pytest.fixture
def no_faults():
    """Runs a test with no fault plan injected, before or after it (``edgecap.faults``)."""
    from edgecap import faults

    faults.inject("")
    yield
    faults.inject("")


@pytest.fixture
def no_leaked_threads():
    """Fails a test that leaves edgecap threads behind (use with pytest.mark.usefixtures)."""
    yield
    assert pipeline_threads() == []


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


SAMPLE_CLIP = REPO / "models" / "demo" / "sample.mp4"


@dataclass(frozen=True)
class Story:
    """Real clips played one after another, each one window long, with its ground truth.

    Attributes:
      frames: uint8 BGR frames at the bundle's sampling rate, ``[windows * per_window, H, W, 3]``.
      truths: The caption of each window, in order.
      per_window: Sampled frames in each clip (the bundle's window).
    """

    frames: np.ndarray
    truths: List[str]
    per_window: int


def sample_story() -> Story:
    """The shipped sample clip (3 windows) then five fresh rendered clips, sampled at 8 fps.

    Neighbouring windows have different ground truth, so any state one window
    leaks into another shows in the captions.
    """
    from models.dataset import read_video, random_spec, render_clip

    doc = json.loads(SAMPLE_CLIP.with_suffix(".json").read_text())
    video, fps = read_video(SAMPLE_CLIP)
    step = int(round(fps / 8.0))  # the demo bundle samples at 8 fps
    parts, truths = [video[::step]], [w["caption"] for w in doc["windows"]]
    for i in range(5):
        # Seeds far from the training data's (see test_quality).
        rng = np.random.default_rng([77_001, i])
        clip, truth = render_clip(random_spec(rng), rng)
        parts.append(clip[::step])
        truths.append(truth)
    frames = np.concatenate(parts)
    per_window = len(parts[1])
    assert len(frames) == per_window * len(truths)
    return Story(frames, truths, per_window)


@pytest.fixture(scope="session")
def story() -> Story:
    """The sample story (``sample_story``), rendered once per session; its frames are read-only."""
    made = sample_story()
    made.frames.setflags(write=False)  # shared by every module that asks: none may change it
    return made


@pytest.fixture(scope="module")
def captioner(shipped_bundle: Path):
    """A CPU captioner of the shipped bundle, one thread, shared by a test module."""
    from edgecap.captioner import EdgeCaptioner

    with EdgeCaptioner(shipped_bundle, num_threads=1) as cap:
        yield cap
