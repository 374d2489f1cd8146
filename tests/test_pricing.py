"""A plan's price (``edgecap.plans.pricing``): one function for its period and latency, one speed convention."""

from __future__ import annotations

import math

import pytest

from edgecap import emulation
from edgecap.devices import DeviceSpec
from edgecap.errors import ConfigError, PlanError
from edgecap.plans.plan import Bus, CostParts, Plan, Stage
from edgecap.plans.pricing import Correction, invoke_ms, price, stage_price

pytestmark = pytest.mark.fast

PCI = ("tpu", 0, "pci")
USB = ("tpu", 0, "usb")


def _stage(index, device, ops, cost=None, predicted_ms=None):
    return Stage(index=index, spec=DeviceSpec(*device) if isinstance(device, tuple) else DeviceSpec(device),
                 segment=None, ops=ops, inputs=(), outputs=(), predicted_ms=predicted_ms, cost=cost)


def _plan(*stages, buses=(), rnn_ms=None, steps=1.0):
    return Plan(path=None, board="b", model_file="m.tflite", model_sha256="0" * 64,
                stages=tuple(stages), buses=tuple(buses), rnn_ms=rnn_ms, rnn_steps_per_frame=steps)


def _ms(stage, corrections=None):
    return stage_price(stage, corrections or {}).ms


def test_each_part_of_a_stage_scales_with_its_own_correction():
    tpu = _stage(0, PCI, (0, 5), CostParts(compute_ms=2.0, invoke_ms=1.0, link_bytes=4_000_000,
                                           link_bytes_per_s=400e6, extra_ms=0.5, link="pcie"))
    cpu = _stage(1, "cpu", (5, 9), CostParts(compute_ms=3.0, invoke_ms=0.1, extra_ms=2.0))
    assert _ms(tpu) == pytest.approx(2.0 + 1.0 + 10.0 + 0.5)
    # The TPU's compute and invoke follow its speed, its link the measured rate; the
    # ops left on the CPU inside it follow the CPU's speed.
    corrections = {"pci:0": Correction(speed=0.5, link_bytes_per_s=200e6), "cpu": Correction(speed=1 / 3)}
    assert _ms(tpu, corrections) == pytest.approx(6.0 + 20.0 + 1.5)
    assert _ms(cpu, corrections) == pytest.approx(3.1 * 3.0 + 2.0 * 3.0)
    assert price(_plan(tpu, cpu)).period_ms == pytest.approx(13.5)
    assert price(_plan(tpu, cpu), corrections).period_ms == pytest.approx(27.5)
    assert price(_plan(tpu, cpu), corrections).latency_ms == pytest.approx(27.5 + 15.3)
    # A device the corrections do not name runs as profiled.
    assert _ms(tpu, {"usb:0": Correction(speed=0.2)}) == pytest.approx(13.5)
    # Faster than profiled is a speed above 1.
    assert _ms(cpu, {"cpu": Correction(speed=2.0)}) == pytest.approx((3.1 + 2.0) / 2)


def test_an_empty_stage_costs_nothing_and_an_older_plan_scales_its_prediction():
    empty = _stage(0, USB, (0, 0), CostParts(compute_ms=0.0, invoke_ms=0.0))
    old = _stage(1, PCI, (0, 4), predicted_ms=4.0)
    cpu = _stage(2, "cpu", (4, 9), predicted_ms=1.0)
    plan = _plan(empty, old, cpu)
    assert price(plan, {"usb:0": Correction(speed=1 / 9)}).period_ms == pytest.approx(4.0)
    assert price(plan, {"pci:0": Correction(speed=2.0), "cpu": Correction(speed=1 / 3)}).period_ms \
        == pytest.approx(3.0)
    with pytest.raises(PlanError, match=r"stages\[1\] on pci:0 has no predicted time"):
        price(_plan(_stage(1, PCI, (0, 4)), cpu))


def test_the_cpus_rnn_steps_count_where_its_stage_runs_no_operators():
    # The CPU runs the RNN steps whatever its CNN stage holds: an empty stage
    # still charges them (cost.extra_ms), at the CPU's speed.
    tpu = _stage(0, PCI, (0, 9), CostParts(compute_ms=2.0))
    empty_cpu = _stage(1, "cpu", (9, 9), CostParts(compute_ms=0.0, extra_ms=3.0))
    plan = _plan(tpu, empty_cpu, rnn_ms=0.75, steps=4.0)
    priced = price(plan)
    assert priced.period_ms == pytest.approx(3.0) and priced.bottleneck_stage == 1
    assert priced.latency_ms == pytest.approx(5.0)
    assert price(plan, {"cpu": Correction(speed=0.5)}).device_ms("cpu") == pytest.approx(6.0)
    # Older plans: the empty stage's predicted time, else the plan's RNN steps a frame.
    assert price(_plan(tpu, _stage(1, "cpu", (9, 9), predicted_ms=2.5))).period_ms == pytest.approx(2.5)
    assert price(_plan(tpu, _stage(1, "cpu", (9, 9)), rnn_ms=0.75, steps=4.0)).period_ms == pytest.approx(3.0)
    assert price(_plan(tpu, rnn_ms=1.0, steps=8.0)).period_ms == pytest.approx(8.0)
    # An active CPU stage's time includes them already: not counted twice.
    active = _stage(1, "cpu", (8, 9), CostParts(compute_ms=0.5, extra_ms=3.0))
    assert price(_plan(_stage(0, PCI, (0, 8), CostParts(compute_ms=2.0)), active, rnn_ms=0.75,
                       steps=4.0)).latency_ms == pytest.approx(5.5)


def test_a_shared_bus_bounds_the_period_by_the_bytes_of_its_stages():
    # Two TPUs each fast alone, whose links together need more than their bus carries.
    a = _stage(0, ("tpu", 0, "usb"), (0, 3), CostParts(compute_ms=1.0, link_bytes=3_000_000,
                                                      link_bytes_per_s=500e6, bus="vl805"))
    b = _stage(1, ("tpu", 1, "usb"), (3, 6), CostParts(compute_ms=1.0, link_bytes=2_000_000,
                                                      link_bytes_per_s=500e6, bus="vl805"))
    cpu = _stage(2, "cpu", (6, 9), CostParts(compute_ms=1.0))
    plan = _plan(a, b, cpu, buses=[Bus("vl805", 400e6)])
    priced = price(plan)
    assert max(s.period_ms for s in priced.stages) == pytest.approx(7.0)
    assert priced.period_ms == pytest.approx(5e6 * 1e3 / 400e6)  # 12.5 ms: the bus, not a stage
    # The bus sets the period: the stage moving the most bytes over it is the bottleneck, as the compiler says.
    assert priced.bottleneck_stage == 0
    assert priced.prediction().bottleneck_ms == pytest.approx(12.5) and priced.prediction().fps == 80.0
    # A correction keyed by the bus's name is its measured rate.
    assert price(plan, {"vl805": Correction(link_bytes_per_s=1e9)}).period_ms == pytest.approx(7.0)
    assert price(_plan(a, b, cpu)).period_ms == pytest.approx(7.0)  # the same stages, no bus


@pytest.mark.parametrize("kwargs", [
    {"speed": 0.0}, {"speed": -1.0}, {"speed": math.nan},
    {"speed": math.inf}, {"speed": True}, {"link_bytes_per_s": 0.0},
    {"link_bytes_per_s": math.inf}, {"speed": "2"},
])
def test_a_correction_out_of_range_is_refused_in_one_line(kwargs):
    with pytest.raises(ConfigError) as err:
        Correction(**kwargs)
    assert "\n" not in str(err.value) and next(iter(kwargs)) in str(err.value)


def _board():
    """Two TPU stages (one behind a link with ops left on the CPU) and a CPU stage with the RNN steps."""
    tpu = _stage(0, PCI, (0, 4), CostParts(compute_ms=2.0, invoke_ms=0.5, link_bytes=1_000_000,
                                           link_bytes_per_s=500e6, extra_ms=0.4), predicted_ms=4.9)
    usb = _stage(1, ("tpu", 0, "usb"), (4, 7), CostParts(compute_ms=1.0, invoke_ms=0.5, link_bytes=400_000,
                                                         link_bytes_per_s=320e6), predicted_ms=2.75)
    cpu = _stage(2, "cpu", (7, 9), CostParts(compute_ms=0.3, extra_ms=1.2), predicted_ms=1.5)
    return _plan(tpu, usb, cpu, rnn_ms=0.3, steps=4.0)


@pytest.mark.parametrize("spec", ["", "pci:0=speed:0.5", "emu-tpu:1=speed:2,link:usb2;cpu=speed:0.25",
                                  "pci:0=throttle:5s;usb:0=link:usb2"])
def test_an_emulated_truth_is_priced_by_the_same_function_as_a_measured_board(spec):
    # A truth's speed (0.5: half as fast) and a learned correction's are one convention:
    # the fps a plan settles at under a truth is its price under the truth's corrections.
    plan = _board()
    truth = emulation.resolve(emulation.parse(spec), plan)
    priced = price(plan, truth.corrections())
    assert emulation.steady_fps(plan, truth) == pytest.approx(priced.fps)
    # And each emulated invoke is paced by the per-stage part at the truth's speed of the
    # moment: at its first invoke, a throttling device is not throttled yet.
    first = price(plan, {d: Correction(t.speed, t.link_bytes_per_s) for d, t in truth.devices})
    with emulation.emulating(truth):
        for k, stage in enumerate(plan.active_stages[:2]):
            pace = emulation.pace(stage, DeviceSpec("emu-tpu", k), stage.predicted_ms)
            paced_ms = stage.predicted_ms if pace is None else (pace.deadline(50.0) - 50.0) * 1e3
            assert paced_ms == pytest.approx(first.stages[k].ms, rel=1e-9)


def test_the_per_stage_part_splits_link_from_work():
    cost = CostParts(compute_ms=2.0, invoke_ms=1.0, link_bytes=2_000_000, link_bytes_per_s=1e9, extra_ms=0.5)
    assert invoke_ms(cost) == pytest.approx((2.0, 3.5))
    assert invoke_ms(cost, speed=2.0, cpu_speed=0.5, link_bytes_per_s=5e8) == pytest.approx((4.0, 1.5 + 1.0))
    # No rate recorded and none measured: the link costs nothing.
    assert invoke_ms(CostParts(compute_ms=1.0, link_bytes=10))[0] == 0.0
