"""A CPU step that raises mid-run (a CNN stage on the CPU, the RNN step): one line and exit code 1, no traceback."""

from __future__ import annotations

import pytest

from edgecap import stages
from edgecap.captioner import EdgeCaptioner
from edgecap.cli import main
from edgecap.command import DEBUG_ENV
from edgecap.errors import StageFailed
from edgecap.rnn import RnnEncoder
from tests.pipeline_boards import pipeline_board

pytestmark = pytest.mark.fast


@pytest.fixture
def rnn_raises(monkeypatch):
    calls = []

    def step(self, feature, state):
        calls.append(1)
        if len(calls) == 20:
            raise RuntimeError("tensor arena exhausted")
        return real(self, feature, state)

    real = RnnEncoder.step
    monkeypatch.setattr(RnnEncoder, "step", step)


@pytest.fixture
def cpu_stage_raises(monkeypatch):
    real = stages.open_stage

    def open_stage(stage, worker, **kwargs):
        runner = real(stage, worker, **kwargs)
        if worker.kind != "cpu":
            return runner
        calls = []

        class Raising:
            def __call__(self, tensors):
                calls.append(1)
                if len(calls) == 5:
                    raise ValueError("Node number 7 (CONV_2D) failed to invoke")
                return runner(tensors)

            def close(self):
                runner.close()

        return Raising()

    monkeypatch.setattr(stages, "open_stage", open_stage)


def _caption(shipped_bundle, capsys, *extra):
    code = main(["caption", "--bundle", str(shipped_bundle), "--board", pipeline_board("devboard-usb"), *extra])
    return code, capsys.readouterr().err


@pytest.mark.usefixtures("rnn_raises")
def test_an_rnn_step_that_raises_is_one_line_and_exit_1(shipped_bundle, capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    code, err = _caption(shipped_bundle, capsys)
    lines = [line for line in err.splitlines() if line.startswith("edgecap: error:")]
    assert code == 1, err
    assert lines == ["edgecap: error: rnn_step on cpu failed at run time: RuntimeError: tensor arena exhausted"]
    assert "Traceback" not in err


@pytest.mark.usefixtures("cpu_stage_raises")
def test_a_cpu_cnn_stage_that_raises_is_one_line_and_exit_1(shipped_bundle, capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    code, err = _caption(shipped_bundle, capsys)
    assert code == 1 and "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("edgecap: error:")]
    assert "(cpu) on cpu failed at run time: ValueError: Node number 7 (CONV_2D) failed to invoke" in line


@pytest.mark.usefixtures("rnn_raises")
def test_edgecap_debug_adds_the_traceback(shipped_bundle, capsys, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    code, err = _caption(shipped_bundle, capsys)
    assert code == 1 and "Traceback" in err and "tensor arena exhausted" in err
    assert err.strip().splitlines()[-1].startswith("edgecap: error: rnn_step on cpu failed at run time")


@pytest.mark.usefixtures("rnn_raises", "no_leaked_threads")
def test_the_library_raises_stage_failed_and_closes_cleanly(shipped_bundle):
    with EdgeCaptioner(shipped_bundle, board=pipeline_board("devboard-usb"), num_threads=1) as cap:
        with pytest.raises(StageFailed) as info:
            list(cap.stream(str(shipped_bundle.parent / "sample.mp4")))
    assert (info.value.step, info.value.worker) == ("rnn_step", "cpu")
    assert isinstance(info.value.__cause__, RuntimeError)
