"""A bounded fuzz of the bundle, plan, service-config and model loaders (edgecap_lab.loader_fuzz).

Each mutated document or model either loads or is refused with edgecap's own
error in one line; nothing else escapes. The long run is tools/fuzz_loaders.py.
"""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")  # the dev extra
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgecap.errors import EdgecapError  # noqa: E402

loader_fuzz = pytest.importorskip("edgecap_lab.loader_fuzz")
BOUNDED = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                   suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def ws():
    try:
        w = loader_fuzz.Workspace()
    except (ImportError, EdgecapError) as exc:  # the compiler writes the plan; a board's runtime may lack it
        pytest.skip(f"no compiler here: {exc}")
    yield w
    w.close()


def test_the_unmutated_documents_load(ws) -> None:
    # The property is only worth something if the valid documents pass it by loading.
    tally = loader_fuzz.Tally()
    ws.bundle_json(loader_fuzz.json_bytes(ws.bundle_doc), tally)
    ws.plan_json(loader_fuzz.json_bytes(ws.plan_doc), tally)
    ws.service_toml(ws.config_text, {}, tally)
    ws.service_toml(loader_fuzz.toml_bytes(ws.config_doc), {}, tally)
    assert tally.outcomes == {"bundle.json": {"loaded": 1}, "plan.json": {"loaded": 1},
                              "service.toml": {"loaded": 2}}


@BOUNDED
@given(st.data())
def test_bundle_json(ws, data) -> None:
    doc = data.draw(loader_fuzz.mutated_doc(ws.bundle_doc))
    ws.bundle_json(loader_fuzz.json_bytes(doc))


@BOUNDED
@given(st.data())
def test_plan_json(ws, data) -> None:
    doc = data.draw(loader_fuzz.mutated_doc(ws.plan_doc))
    ws.plan_json(loader_fuzz.json_bytes(doc))


@BOUNDED
@given(st.data())
def test_json_text(ws, data) -> None:
    ws.bundle_json(data.draw(loader_fuzz.mutated_text(loader_fuzz.json_bytes(ws.bundle_doc))))
    ws.plan_json(data.draw(loader_fuzz.mutated_text(loader_fuzz.json_bytes(ws.plan_doc))))


@BOUNDED
@given(st.data())
def test_service_toml(ws, data) -> None:
    if data.draw(st.booleans()):
        blob = loader_fuzz.toml_bytes(data.draw(loader_fuzz.mutated_doc(ws.config_doc)))
    else:
        blob = data.draw(loader_fuzz.mutated_text(ws.config_text))
    overrides = data.draw(st.dictionaries(
        st.sampled_from(["http.port", "cameras[0].fps", "board", "cameras[9].name", "http", "x.y", "..",
                         "cameras[0]", "plan"]),
        loader_fuzz.values, max_size=2))
    ws.service_toml(blob, overrides)


def test_model_bytes_in_a_child_process() -> None:
    result = loader_fuzz.fuzz_models_in_child(cases=40, seed=0, timeout_s=120)
    assert not result["findings"], result["findings"]
    assert sum(result["cases"].values()) == 40


def _with(doc: dict, edit) -> bytes:
    doc = loader_fuzz.json.loads(loader_fuzz.json.dumps(doc))
    edit(doc)
    return loader_fuzz.json_bytes(doc)


def test_what_the_long_run_found_stays_fixed(ws) -> None:
    # results/fuzz.json: each of these escaped the loaders as a Python exception before.
    lone = "\ud800"
    bad_utf8 = loader_fuzz.json_bytes(ws.bundle_doc).replace(b'"provenance"', b'"\xffprovenance"')
    cases = [
        ("bundle.json", bad_utf8, r"not valid JSON \(.*UTF-8"),
        ("bundle.json", _with(ws.bundle_doc, lambda d: d["rnn"].update(hidden_size=lone)), "not valid Unicode"),
        ("bundle.json", _with(ws.bundle_doc, lambda d: d.update(vocab="a\x00b")), "contains a NUL byte"),
        ("bundle.json", _with(ws.bundle_doc, lambda d: d.update(vocab="x" * 300)), "over 255 bytes"),
        ("plan.json", loader_fuzz.json_bytes(lone), "not valid Unicode"),
        ("plan.json", _with(ws.plan_doc, lambda d: d["stages"][0].update(segment="s\x00")), "contains a NUL byte"),
        ("bundle.json", _with(ws.bundle_doc, lambda d: d.update(provenance="<<deep>>")), "nested too deeply"),
        # plan_version is read untyped first: the recursion that escaped as RecursionError.
        ("plan.json", _with(ws.plan_doc, lambda d: d.update(plan_version="<<deep>>")),
         "field 'plan_version' must be int, got array"),
    ]
    for target, blob, match in cases:
        (ws.bundle / "bundle.json" if target == "bundle.json" else ws.plan / "plan.json").write_bytes(blob)
        with pytest.raises(EdgecapError, match=match):
            (loader_fuzz.load_bundle(ws.bundle) if target == "bundle.json" else loader_fuzz.load_plan(ws.plan))
    ws.config.write_bytes(ws.config_text)
    with pytest.raises(EdgecapError, match=r"override http: a string that is not valid Unicode"):
        loader_fuzz.load_config(ws.config, {"http": lone})
    # The seed-2 long run: a token file named with a NUL reached os.stat.
    config = loader_fuzz.json.loads(loader_fuzz.json.dumps(ws.config_doc))
    config["http"]["token_file"] = "t\x00"
    ws.config.write_bytes(loader_fuzz.toml_bytes(config))
    with pytest.raises(EdgecapError, match=r"'.*t\\x00' is not a usable file name \(it contains a NUL byte\)"):
        loader_fuzz.load_config(ws.config)
    ws.bundle_json(_with(ws.bundle_doc, lambda d: d["rnn"].update(decoder_step="\n")))  # one line, or it fails
    ws.config.write_bytes(loader_fuzz.toml_bytes({"board": "<<deep>>"}))
    with pytest.raises(EdgecapError, match=r"malformed TOML \(arrays or tables nested too deeply\)"):
        loader_fuzz.load_config(ws.config)
