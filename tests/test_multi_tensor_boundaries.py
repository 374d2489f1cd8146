"""The compiler's own plans cut where several tensors are live, and they run exactly (issue 17 item 2, 3).

``edgecap compile`` writes every tensor live across a cut (``Graph.live_across``)
at the boundary and prices all of them as link bytes, and a stage forwards a
tensor that skips it: no partitioner change was needed for cuts with two or
more live tensors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgecap.interpreter import make_cpu_interpreter
from edgecap.plans.plan import load_plan
from edgecap.stages import open_stage
from edgecap_compile.compiler import compile_model

DATA = Path(__file__).resolve().parent / "data" / "compile"


def _whole(model: Path, x: np.ndarray) -> np.ndarray:
    interp = make_cpu_interpreter(model)
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def _bytes(tensors) -> int:
    return sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in tensors)


@pytest.mark.parametrize("model, ranges, widths, forwarded", [
    # Cut where the four inception branches are live, and before they meet again.
    ("tiny_inception.tflite", [(0, 5), (5, 14), (14, 21)], [4, 4], 0),
    # A dense block's input skips a one-op stage (written by stage 0, read by stage 2).
    ("tiny_densenet.tflite", [(0, 2), (2, 3), (3, 29)], [2, 2], 1),
])
def test_a_plan_cut_at_several_live_tensors_runs_exactly_and_prices_them_all(tmp_path: Path, model, ranges,
                                                                             widths, forwarded) -> None:
    source = DATA / model
    plan = load_plan(compile_model(source, "devboard-usb", tmp_path / "plan", ranges=ranges).plan_path)
    stages = plan.active_stages
    assert [len(s.outputs) for s in stages[:-1]] == widths
    assert sum(len({t.name for t in s.inputs} & {t.name for t in s.outputs}) for s in stages) == forwarded
    for s in stages[:-1]:  # what the segment reads and writes crosses the TPU's link; what it forwards does not
        passing = {t.name for t in s.inputs} & {t.name for t in s.outputs}
        crossing = _bytes([t for t in (*s.inputs, *s.outputs) if t.name not in passing])
        assert s.cost.link_bytes - s.param_bytes.streamed == crossing
    runners = [open_stage(s, "cpu") for s in stages]
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.integers(-128, 128, plan.inputs[0].shape, dtype=np.int8)
        tensors = {plan.inputs[0].name: x}
        for runner in runners:
            tensors = runner(tensors)
        np.testing.assert_array_equal(tensors[plan.outputs[0].name], _whole(source, x))
