"""Model files are verified before any interpreter parses them (issue #8, item 3)."""

from __future__ import annotations

import random
import struct
import threading
import time
from pathlib import Path
from typing import List, Tuple

import pytest

from conftest import pipeline_threads
from edgecap import interpreter
from edgecap.bundle import load_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.cli import main
from edgecap.errors import EdgecapError, BundleError, PlanError
from edgecap.tflite_verify import verify_tflite

REPO = Path(__file__).resolve().parent.parent
MODELS = sorted([*REPO.glob("models/demo/bundle/*.tflite"), *REPO.glob("tests/data/**/*.tflite")])
TINY = REPO / "tests" / "data" / "runtime" / "tiny_encoder.tflite"


def _refused(data: bytes, error=BundleError) -> str:
    with pytest.raises(error) as info:
        verify_tflite(data, "m.tflite", error=error)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("m.tflite: corrupt or truncated TFLite model ("), msg
    return msg


# A reader of the few fields the tests patch, written from schema.fbs apart
# from edgecap's verifier so that the tests do not check it against itself.
def _u32(data: bytes, pos: int) -> int:
    return struct.unpack_from("<I", data, pos)[0]


def _field(data: bytes, table: int, slot: int) -> int:
    vtable = table - struct.unpack_from("<i", data, table)[0]
    if 4 + 2 * slot >= struct.unpack_from("<H", data, vtable)[0]:
        raise LookupError(f"slot {slot} absent")
    voff = struct.unpack_from("<H", data, vtable + 4 + 2 * slot)[0]
    if not voff:
        raise LookupError(f"slot {slot} absent")
    return table + voff


def _deref(data: bytes, pos: int) -> int:
    return pos + _u32(data, pos)


def _tables(data: bytes, table: int, slot: int) -> List[int]:
    vec = _deref(data, _field(data, table, slot))
    return [_deref(data, vec + 4 + 4 * i) for i in range(_u32(data, vec))]


def _tensors(data: bytes) -> List[int]:
    model = _deref(data, 0)
    return _tables(data, _tables(data, model, 2)[0], 0)  # Model.subgraphs[0].tensors


def _name(data: bytes, tensor: int) -> Tuple[int, int]:
    """(position, length) of a tensor's name bytes (Tensor.name is slot 3)."""
    s = _deref(data, _field(data, tensor, 3))
    return s + 4, _u32(data, s)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_model_in_the_repo_passes(path: Path) -> None:
    verify_tflite(path.read_bytes(), str(path))


def test_the_demo_encoder_verifies_in_a_few_milliseconds(shipped_bundle: Path) -> None:
    data = (shipped_bundle / "encoder.tflite").read_bytes()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        verify_tflite(data, "encoder.tflite")
        best = min(best, time.perf_counter() - t0)
    # 1.8 ms measured on the dev host; the bound leaves room for a shared, slow CI machine.
    assert best < 0.05


def test_truncated_at_every_fiftieth_is_refused(shipped_bundle: Path) -> None:
    data = (shipped_bundle / "encoder.tflite").read_bytes()
    for k in range(1, 50):  # 0 bytes: not a TFLite model at all (below)
        _refused(data[: len(data) * k // 50])


def test_the_last_bytes_cut_off_are_refused() -> None:
    data = TINY.read_bytes()
    for cut in range(1, 65):
        _refused(data[:-cut])


def test_not_a_flatbuffer_is_refused() -> None:
    for data in (b"hello, world", b"", TINY.read_bytes()[:7]):
        with pytest.raises(BundleError, match=r"^m\.tflite: not a TFLite model \(no TFL3 identifier at bytes 4\.\.8\); re-export it$"):
            verify_tflite(data, "m.tflite")


def test_random_bytes_are_refused() -> None:
    rng = random.Random(8)
    for n in (8, 64, 4096):
        for _ in range(20):
            with pytest.raises(BundleError):
                verify_tflite(bytes(rng.randrange(256) for _ in range(n)), "m.tflite")


def test_random_bytes_behind_the_identifier_are_refused() -> None:
    rng = random.Random(9)
    for _ in range(50):
        body = bytes(rng.randrange(256) for _ in range(512))
        _refused(body[:4] + b"TFL3" + body[8:])


def test_flipped_bytes_raise_only_the_error() -> None:
    data = TINY.read_bytes()
    rng = random.Random(10)
    refused = 0
    for _ in range(400):
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        try:
            verify_tflite(bytes(b), "m.tflite")
        except BundleError as exc:
            assert "\n" not in str(exc)
            refused += 1
    # Most of a tiny model is tables, not weights: a flip there is mostly caught.
    assert refused > 100


def test_a_name_that_is_not_utf8_is_refused() -> None:
    data = bytearray(TINY.read_bytes())
    pos, length = _name(data, _tensors(data)[0])
    assert length > 0
    data[pos] = 0xFF
    msg = _refused(bytes(data))
    assert "subgraphs[0].tensors[0].name: not valid UTF-8" in msg


def test_a_buffer_index_out_of_range_is_refused() -> None:
    data = bytearray(TINY.read_bytes())
    tensor = _tensors(data)[1]
    struct.pack_into("<I", data, _field(data, tensor, 2), 9999)  # Tensor.buffer
    assert "buffer: index 9999 out of range" in _refused(bytes(data))


def test_an_operator_reading_a_missing_tensor_is_refused() -> None:
    data = bytearray(TINY.read_bytes())
    model = _deref(data, 0)
    op = _tables(data, _tables(data, model, 2)[0], 3)[0]  # subgraphs[0].operators[0]
    inputs = _deref(data, _field(data, op, 1))
    struct.pack_into("<i", data, inputs + 4, 5000)
    assert "operators[0].inputs: index 5000 out of range" in _refused(bytes(data))


def test_a_constant_whose_data_does_not_fit_its_shape_is_refused() -> None:
    data = bytearray(TINY.read_bytes())
    # Point a constant tensor at another constant's buffer of a different size.
    model = _deref(data, 0)
    buffers = _tables(data, model, 4)

    def size(b: int) -> int:
        try:
            return _u32(data, _deref(data, _field(data, buffers[b], 0)))
        except LookupError:  # no data: not a constant
            return 0

    consts = [(t, _u32(data, _field(data, t, 2))) for t in _tensors(data)]
    consts = [(t, b) for t, b in consts if size(b)]
    t0, b0 = consts[0]
    other = next(b for _, b in consts if size(b) != size(b0))
    struct.pack_into("<I", data, _field(data, t0, 2), other)
    assert f"holds {size(other)} bytes" in _refused(bytes(data))


def test_the_error_and_fix_are_the_callers() -> None:
    with pytest.raises(PlanError, match=r"; re-run it$"):
        verify_tflite(TINY.read_bytes()[:-1], "m.tflite", error=PlanError, fix="re-run it")


# --- where edgecap opens models ---------------------------------------------------------------


def test_a_truncated_bundle_model_never_reaches_the_interpreter(bundle_copy: Path, monkeypatch) -> None:
    enc = bundle_copy / "encoder.tflite"
    enc.write_bytes(enc.read_bytes()[:-100])
    opened: List[bytes] = []
    real = interpreter.make_cpu_interpreter
    monkeypatch.setattr("edgecap.modelfile.make_cpu_interpreter", lambda m, *a: opened.append(m) or real(m, *a))
    with pytest.raises(BundleError, match=r"encoder\.tflite: corrupt or truncated TFLite model \(.*re-export it"):
        load_bundle(bundle_copy)
    assert all(len(m) != enc.stat().st_size for m in opened)


def test_validate_of_a_truncated_encoder_is_one_line_exit_2(bundle_copy: Path, capsys) -> None:
    enc = bundle_copy / "encoder.tflite"
    enc.write_bytes(enc.read_bytes()[: enc.stat().st_size // 2])
    code = main(["validate", str(bundle_copy)])
    _, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "encoder.tflite: corrupt or truncated TFLite model" in lines[0], err


def test_a_plan_with_a_truncated_segment_is_refused_before_it_runs(shipped_bundle: Path, tmp_path: Path,
                                                                   monkeypatch) -> None:
    try:  # the compiler cuts the plan; it refuses to import where only the runtime can run
        from edgecap_compile import graph
    except (ImportError, EdgecapError) as exc:
        pytest.skip(f"no compiler here: {exc}")
    from runtime_plans import write_plan

    encoder = shipped_bundle / "encoder.tflite"
    n = len(graph.read_graph(encoder).ops)
    plan = write_plan(encoder, [n // 2], ["tpu:0", "cpu"], tmp_path, [0.3, 0.3])
    segments = sorted(tmp_path.glob("*.tflite"))
    bad = segments[-1]
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size * 2 // 3])
    opened: List[str] = []
    real = interpreter.make_cpu_interpreter
    monkeypatch.setattr(interpreter, "make_cpu_interpreter",
                        lambda m, *a: opened.append(threading.current_thread().name) or real(m, *a))
    # load_plan reads every segment: the cut is found before any worker or interpreter starts.
    with pytest.raises(PlanError, match=rf"{bad.name} has \d+ bytes, plan.json recorded \d+: .*edgecap compile"):
        EdgeCaptioner(shipped_bundle, plan=plan, num_threads=1)
    assert opened == []
    assert pipeline_threads() == []
