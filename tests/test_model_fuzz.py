"""A sample of the structural model fuzz (edgecap_lab.model_fuzz; the long run is tools/fuzz_models.py):
mutants of the demo's models and the real fixtures, each refused in one line or run, none crashing."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

model_fuzz = pytest.importorskip("edgecap_lab.model_fuzz")

BASES = model_fuzz.DEMO_BASES + model_fuzz.REAL_BASES


def test_200_mutants_are_refused_in_one_line_or_run(tmp_path: Path) -> None:
    tally = model_fuzz.run(BASES, 200, seed=11, keep=tmp_path / "crashes")
    assert tally.mutants == 200
    assert not tally.crashes and not tally.findings, (tally.crashes + tally.findings)[:3]
    assert set(tally.outcomes) <= {"refused", "ran", "described"}
    # The checks all had work: the sample reaches past the flatbuffer walk.
    assert {"flatbuffer walk", "operator check"} <= set(tally.refused_by)
    assert tally.outcomes.get("ran", 0) > 0


def test_a_mutant_is_a_function_of_seed_and_index() -> None:
    bases = [model_fuzz.Base.read(p) for p in BASES]
    for i in random.Random(0).sample(range(10_000), 5):
        assert model_fuzz.mutant(bases, 3, i)[1:] == model_fuzz.mutant(bases, 3, i)[1:]


def test_a_worker_that_dies_is_a_crash_named_with_its_mutant(tmp_path: Path, monkeypatch) -> None:
    # A worker killed by a signal mid-mutant (what a native crash does) is counted, its mutant kept,
    # and the run goes on after it.
    monkeypatch.setenv("EDGECAP_MODEL_FUZZ_DIE_AT", "1")
    tally = model_fuzz.run(BASES[:1], 3, seed=1, keep=tmp_path / "crashes")
    assert tally.mutants == 3 and len(tally.crashes) == 1 and tally.crashes[0]["i"] == 1
    assert "SIGSEGV" in tally.crashes[0]["message"]
    assert (tmp_path / "crashes" / "crash-1.tflite").is_file()
