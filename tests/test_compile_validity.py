"""The validity table's pure parts: features, fit, leave-one-out, and the shipped data."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import numpy as np
import pytest

from edgecap_compile.boards import PRICES, load_board
from edgecap_lab.cost_model_validity import (COLUMNS, DATA, Published, column_table, features, fit,
                                      leave_one_out, load_published, markdown, validity)


def _model(name: str, macs: float, params: int, ms: float = 1.0) -> Published:
    return Published(name=name, input=224, macs=macs, params=params, devboard_tpu_ms=ms,
                     embedded_cpu_ms=ms, usb_tpu_ms=ms, counts_source="test")


def _synthetic(device, count: int = 7):
    rng = np.random.default_rng(0)
    models = [_model(f"m{i}", float(rng.uniform(2e8, 1e10)), int(rng.uniform(1e6, 4e7)))
              for i in range(count)]
    x = np.array([features(m, device) for m in models])
    return models, x


def test_tpu_features_stream_only_the_parameters_beyond_the_usable_sram():
    tpu = load_board("devboard").with_sram(1_000_000).tpus[0]
    cpu = load_board("devboard").cpu
    image = 3 * 224 ** 2 + 1001
    small, big = _model("s", 1e9, 900_000), _model("b", 1e9, 3_000_000)
    link = [feature for feature, _ in PRICES].index("link_bytes")
    assert features(small, tpu)[link] == image
    assert features(big, tpu)[link] == image + 2_000_000
    assert features(big, cpu)[link] == 0


def test_fit_recovers_the_coefficients_that_made_the_latencies():
    prior = load_board("devboard").with_sram(4 << 20).tpus[0]
    truth = dataclasses.replace(prior, macs_per_s=4e11, invoke_overhead_ms=2.5,
                                link_bytes_per_s=2e8)
    _, x = _synthetic(prior)
    y = x @ truth.coefficients()
    fitted = fit(x, y, prior, ("macs_per_s", "invoke_overhead_ms", "link_bytes_per_s"))
    assert fitted.macs_per_s == pytest.approx(4e11, rel=1e-6)
    assert fitted.invoke_overhead_ms == pytest.approx(2.5, rel=1e-6)
    assert fitted.link_bytes_per_s == pytest.approx(2e8, rel=1e-6)
    # What the fit does not free keeps the profile's value.
    assert fitted.elements_per_s == prior.elements_per_s


def test_leave_one_out_is_exact_on_consistent_data_and_exposes_an_outlier():
    prior = load_board("devboard").tpus[0]
    truth = dataclasses.replace(prior, macs_per_s=5e11, invoke_overhead_ms=1.0)
    _, x = _synthetic(prior)
    y = x @ truth.coefficients()
    fields = ("macs_per_s", "invoke_overhead_ms", "link_bytes_per_s")
    np.testing.assert_allclose(leave_one_out(x, y, prior, fields), y, rtol=1e-6)
    y_bad = y.copy()
    y_bad[3] *= 2
    loo = leave_one_out(x, y_bad, prior, fields)
    in_sample = x @ fit(x, y_bad, prior, fields).coefficients()
    # Out of sample the outlier is predicted from the others: nearer its clean value.
    assert abs(loo[3] / y_bad[3] - 1) > abs(in_sample[3] / y_bad[3] - 1)
    assert loo[3] == pytest.approx(y[3], rel=1e-6)


def test_shipped_data_covers_coral_table_and_every_column():
    data = load_published(DATA)
    names = {m.name for m in data.models}
    assert {"MobileNet v1", "MobileNet v2", "Inception v1", "Inception v4", "ResNet-50 v1",
            "EfficientNet-EdgeTPU-S", "EfficientNet-EdgeTPU-M"} <= names
    assert all(m.counts_source for m in data.models)
    for column in COLUMNS:
        table = column_table(data.models, column)
        assert len(table["rows"]) == len(data.models)
        for r in table["rows"]:
            assert r["profile_error"] == pytest.approx(r["profile_ms"] / r["published_ms"] - 1,
                                                       abs=1e-3)


def test_markdown_marks_rows_beyond_the_goal():
    doc = validity(DATA)
    doc["columns"][0]["rows"][0]["loo_error"] = 0.9
    text = markdown(doc)
    assert "| NO |" in text
    assert "Goal missed on" in text and doc["columns"][0]["rows"][0]["model"] in text


def test_a_cached_graph_replaces_the_published_counts_and_its_absence_does_not(monkeypatch):
    from pathlib import Path

    from edgecap_lab import keras_zoo
    from edgecap_compile.graph import read_graph
    from edgecap_lab.cost_model_validity import model_work

    fixture = Path(__file__).parent / "data" / "compile" / "tiny_mobilenet.tflite"
    model = msgspec.structs.replace(_model("m", 1e9, 5_000_000), graph="MobileNetV2")
    monkeypatch.setattr(keras_zoo, "model_path", lambda name, generate=True: fixture)
    work = model_work(model)
    ops = read_graph(fixture).ops
    assert (work.ops, work.macs, work.source) == (len(ops), sum(o.macs for o in ops),
                                                  "graph tiny_mobilenet.tflite")
    assert work.elements > 0

    def missing(name, generate=True):
        raise FileNotFoundError(name)

    monkeypatch.setattr(keras_zoo, "model_path", missing)
    work = model_work(model)
    assert (work.ops, work.macs, work.elements, work.source) == (1, 1e9, 0.0, "published counts")


def test_an_unwritable_out_is_refused_before_the_table_is_built(tmp_path, monkeypatch):
    from edgecap.errors import ConfigError
    from edgecap_lab import cost_model_validity as validity

    monkeypatch.setattr(validity, "validity", lambda *a: pytest.fail("built the table first"))
    with pytest.raises(ConfigError, match="no directory"):
        validity.main(["--out", str(tmp_path / "missing" / "cost-model")])


def test_the_command_writes_nothing_unless_given_out(tmp_path, monkeypatch, capsys):
    # results/cost-model.md and .json are tracked: a plain run must not rewrite them (issue 19).
    from edgecap_lab import cost_model_validity as module

    written = []
    real = module.write_text

    def record(path, text):
        written.append(str(path))
        if Path(path).parent == tmp_path:  # never the tracked files, even when the test fails
            real(path, text)

    monkeypatch.setattr(module, "write_text", record)
    assert module.main([]) == 0
    table = capsys.readouterr().out
    assert written == [] and "leave-one-out" in table
    assert module.main(["--out", str(tmp_path / "cm")]) == 0
    assert written == [str(tmp_path / "cm.json"), str(tmp_path / "cm.md")]
    assert (tmp_path / "cm.md").read_text() + "\n" == capsys.readouterr().out


def test_a_link_rate_the_data_would_put_above_the_line_rate_is_fitted_on_the_bound():
    # Latencies made with a USB link faster than USB 3.0 can carry: the fit
    # keeps the link at the 500 MB/s line rate and refits the rest to it.
    prior = load_board("devboard-usb").with_sram(1 << 20).tpus[1]
    assert prior.link == "usb3"
    truth = dataclasses.replace(prior, link_bytes_per_s=8e8)
    models, x = _synthetic(prior)
    y = x @ truth.coefficients()
    fitted = fit(x, y, prior, ("macs_per_s", "invoke_overhead_ms", "link_bytes_per_s"))
    assert fitted.link_bytes_per_s == pytest.approx(5e8)
    # The refit is the best on the bound: better than the truth's other figures with it.
    bounded_truth = dataclasses.replace(truth, link_bytes_per_s=5e8)

    def error(device):
        return float(np.sum(((x @ device.coefficients() - y) / y) ** 2))

    assert error(fitted) < error(bounded_truth)
    # A rate within the line rate is fitted as before.
    slower = dataclasses.replace(prior, link_bytes_per_s=3e8)
    y = x @ slower.coefficients()
    assert fit(x, y, prior, ("macs_per_s", "invoke_overhead_ms", "link_bytes_per_s")
               ).link_bytes_per_s == pytest.approx(3e8, rel=1e-6)
