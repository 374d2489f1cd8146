"""The supervisor's bookkeeping: what a file source holds for a replay, what is in flight, and
the bundle's plans read once, at the first failure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Optional, Tuple

import numpy as np
import pytest

from edgecap import planner
from edgecap import supervisor as supervisor_module
from edgecap.bundle import WindowSpec, load_bundle
from edgecap.options import CaptionerOptions
from edgecap.sources import Frame
from edgecap.supervisor import Run, Supervisor, _Source

from test_planner import bundle_with_plans  # noqa: F401 (a fixture)

pytestmark = pytest.mark.fast

SPEC = WindowSpec(frames=4, stride=2, sample_fps=8.0)


@dataclass
class _Job:
    stream: Tuple[Run, Optional[Hashable]]
    frame: Frame
    pos: int
    tensors: dict = field(default_factory=dict)
    ms: dict = field(default_factory=dict)


def _source(n: int, hold: bool) -> _Source:
    items = iter([(None, Frame(i, i / 8.0, np.zeros((2, 2, 3), np.uint8))) for i in range(n)])
    return _Source(items, _Job, {}, SPEC, hold)


def test_a_file_source_holds_only_the_windows_not_yet_captioned():
    source = _source(40, hold=True)
    for job in source.jobs(Run({}), {}):
        assert source.consumed(job)
    held = sum(len(h) for h in source._held.values())
    # 40 frames out: windows end at samples 3, 5, ..., 39; window 19 (samples 38-41) is still open.
    assert held == 2
    assert source.replay_count({None: (38, 19)}) == 2


def test_frames_read_but_not_out_are_in_flight():
    source = _source(10, hold=False)
    jobs = source.jobs(Run({}), {})
    read = [next(jobs) for _ in range(7)]
    for job in read[:4]:
        source.consumed(job)
    assert source.in_flight() == 3
    assert source.resume(live=True) == ({None: (4, 2)}, 1)  # window 1 (samples 2-5) is lost


class _Idle:
    """A pipeline stand-in: the supervisor only opens and closes it here."""

    def close(self) -> None:
        pass


def test_the_bundles_plans_are_read_once_at_the_first_failure(bundle_with_plans, monkeypatch):  # noqa: F811
    bundle = load_bundle(bundle_with_plans)
    options = CaptionerOptions(board="devboard-usb", num_threads=1)
    start = planner.choose(bundle, options)
    calls = []
    real = supervisor_module.bundle_plans
    monkeypatch.setattr(supervisor_module, "bundle_plans", lambda *a, **k: calls.append(a) or real(*a, **k))
    supervisor = Supervisor(bundle, options, start, lambda choice, released: _Idle())
    try:
        assert supervisor._choose().how == "original" and calls == []  # nothing failed: nothing read
        supervisor._failed = [start.tpus[0]]
        first, again = supervisor._choose(), supervisor._choose()
    finally:
        supervisor.close()
    assert len(calls) == 1 and calls[0][2] == "devboard-usb"  # the running plan's board's
    assert first.how == again.how and first.describe() == again.describe()


def test_the_c_heaps_free_pages_go_back_once_a_new_pipeline_runs(shipped_bundle, monkeypatch):
    # Each pipeline's new threads get glibc arenas of their own that keep what the old ones freed;
    # the soak's memory grew past its goal without a trim after each switch (results/soak.md).
    from edgecap import faults, supervisor
    from edgecap.captioner import EdgeCaptioner
    from edgecap.sources import open_source

    trims = []
    monkeypatch.setattr(supervisor, "_release_freed_memory", lambda: trims.append(1))
    images = [f.image for f in open_source(str(shipped_bundle.parent / "sample.mp4"))]
    faults.inject("emu-tpu:0=fail@10")
    try:
        with EdgeCaptioner(shipped_bundle, board="devboard-usb", num_threads=1) as cap:
            cap.caption_frames(images * 2)
            switches = len(cap.stats().failovers)
    finally:
        faults.inject("")
    assert switches == 1 and len(trims) == 1
    assert supervisor._malloc_trim() is None or supervisor._malloc_trim()(0) in (0, 1)
