"""The first invoke in a child process (edgecap.trial_invoke): a model that crashes the interpreter
is refused in one line, naming it and the signal, before this process opens it; paid once per file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgecap import trial_invoke
from edgecap.bundle import load_bundle
from edgecap.cli import main
from edgecap.errors import BundleError
from edgecap.tflite_verify import verify_tflite

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "models" / "demo" / "bundle"
REAL = REPO / "tests" / "data" / "real_models"
CRASHES = REAL / "split_concat_bad_options.tflite"  # passes the verifier, segfaults TFLite


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setattr(trial_invoke, "_passed", set())
    return cache


def test_a_model_that_crashes_the_interpreter_is_refused_in_one_line() -> None:
    data = CRASHES.read_bytes()
    verify_tflite(data, str(CRASHES))  # the flatbuffer is whole: only running it shows the crash
    with pytest.raises(BundleError) as info:
        trial_invoke.check(data, CRASHES)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{CRASHES}: the model crashed the TFLite interpreter")
    assert "killed by SIGSEGV" in msg or "killed by SIG" in msg


def test_validate_refuses_it_with_exit_2_and_this_process_lives(tmp_path: Path, capsys) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(DEMO, bundle)
    shutil.copy(CRASHES, bundle / "encoder.tflite")
    assert main(["validate", str(bundle)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "crashed the TFLite interpreter" in err and "SIG" in err


def test_a_passing_model_is_checked_once_per_content(fresh_cache: Path, monkeypatch) -> None:
    data = (DEMO / "encoder.tflite").read_bytes()
    assert trial_invoke.check(data, DEMO / "encoder.tflite").kind == "ok"
    assert len(list((fresh_cache / "edgecap" / "invoked").iterdir())) == 1
    load_bundle(DEMO)  # its other models, each checked once
    monkeypatch.setattr(trial_invoke, "_passed", set())  # a new process: only the disk remembers

    def no_child(path):
        raise AssertionError(f"{path} checked again")

    monkeypatch.setattr(trial_invoke, "trial", no_child)
    load_bundle(DEMO)


def test_an_interpreter_error_is_left_to_the_callers_open() -> None:
    # A custom op no interpreter here resolves (as an EdgeTPU-compiled model on a CPU host): no crash.
    model = REAL / "model_invoking_error.tflite"
    outcome = trial_invoke.check(model.read_bytes(), model)
    assert outcome.kind == "error" and "fake-op-double" in outcome.detail


def test_a_crashed_model_is_not_remembered(fresh_cache: Path) -> None:
    with pytest.raises(BundleError):
        trial_invoke.check(CRASHES.read_bytes(), CRASHES)
    assert not (fresh_cache / "edgecap" / "invoked").exists() or not any(
        (fresh_cache / "edgecap" / "invoked").iterdir())


def test_a_killed_checker_is_started_again() -> None:
    assert trial_invoke.trial(DEMO / "rnn_encoder_step.tflite").kind == "ok"
    trial_invoke._checker.proc.kill()
    trial_invoke._checker.proc.wait()
    assert trial_invoke.trial(DEMO / "rnn_decoder_step.tflite").kind == "ok"


def test_a_plan_segment_that_crashes_the_interpreter_is_refused_before_it_opens(tmp_path: Path) -> None:
    import dataclasses

    from edgecap.errors import PlanError
    from edgecap.plans.plan import load_plan
    from edgecap.stages import open_stage
    from edgecap_compile import compile_model

    compile_model(DEMO, "devboard-usb", tmp_path / "plan")
    stage = next(s for s in load_plan(tmp_path / "plan").stages if s.segment is not None)
    with pytest.raises(PlanError) as info:
        open_stage(dataclasses.replace(stage, segment=CRASHES), "cpu")
    msg = str(info.value)
    assert "\n" not in msg and "crashed the TFLite interpreter" in msg and "re-run `edgecap compile`" in msg
