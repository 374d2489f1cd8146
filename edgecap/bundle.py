"""Loads and validates a model bundle (schema version 1, see docs/bundle.md)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edgecap.errors import BundleError
from edgecap.interpreter import make_cpu_interpreter

SCHEMA_VERSION = 1
# The shipped demo (bundle, sample clip and its ground truth), in a source checkout.
DEMO_DIR = Path(__file__).resolve().parent.parent / "models" / "demo"
_QUANTIZED = (np.int8, np.uint8)
_ENCODER_STEP_IO = ({"feature", "h", "c"}, {"h_out", "c_out"})
_DECODER_STEP_IO = ({"word", "h", "c"}, {"logits", "h_out", "c_out"})


def resolve_inside(root: Path, name: str) -> Optional[Path]:
    """Returns ``root / name`` resolved, or None if it leaves ``root`` (``..``, a symlink).

    Bundles and plans name their files relative to their own directory; a name
    that escapes it would read whatever the file's author pointed at.
    """
    root = root.resolve()
    target = (root / name).resolve()
    return target if root in target.parents else None


@dataclass(frozen=True)
class InputSpec:
    """What the encoder takes: frame size, channel order and normalisation."""

    height: int
    width: int
    channels: int
    color_order: str
    mean: Tuple[float, ...]
    std: Tuple[float, ...]


@dataclass(frozen=True)
class WindowSpec:
    """How sampled frames group into caption windows."""

    frames: int
    stride: int
    sample_fps: float


@dataclass(frozen=True)
class Tokens:
    """Special token ids."""

    pad: int
    bos: int
    eos: int
    unk: int


@dataclass(frozen=True)
class Bundle:
    """A validated model bundle; every path is absolute and inside ``root``."""

    root: Path
    name: str
    encoder: Path
    reference_encoder: Optional[Path]
    encoder_step: Path
    decoder_step: Path
    vocab: Tuple[str, ...]
    input: InputSpec
    feature_size: int
    hidden_size: int
    window: WindowSpec
    max_caption_length: int
    tokens: Tokens
    meta: Dict[str, Any]

    def detokenize(self, ids: List[int]) -> str:
        """Returns the sentence for token ids, dropping special tokens."""
        special = {self.tokens.pad, self.tokens.bos, self.tokens.eos}
        return " ".join(self.vocab[i] for i in ids if i not in special)


def default_bundle() -> Path:
    """Returns the bundle to use when none is given: $EDGECAP_BUNDLE, else the shipped demo."""
    env = os.environ.get("EDGECAP_BUNDLE")
    return Path(env) if env else DEMO_DIR / "bundle"


class _Reader:
    """Reads typed fields of bundle.json, naming file and field in every error."""

    def __init__(self, json_path: Path, data: Dict[str, Any]):
        self.json_path = json_path
        self.data = data

    def fail(self, field: str, problem: str) -> BundleError:
        return BundleError(f"{self.json_path}: field '{field}' {problem}")

    def get(self, field: str, kind: type, default: Any = ...) -> Any:
        node: Any = self.data
        for part in field.split("."):
            if not isinstance(node, dict) or part not in node:
                if default is not ...:
                    return default
                raise self.fail(field, "is missing: add it (see docs/bundle.md)")
            node = node[part]
        ok = isinstance(node, kind) and not (kind in (int, float) and isinstance(node, bool))
        if kind is float and isinstance(node, int) and not isinstance(node, bool):
            node, ok = float(node), True
        if not ok:
            raise self.fail(field, f"must be {kind.__name__}, got {json.dumps(node)}")
        return node

    def positive(self, field: str) -> int:
        value = self.get(field, int)
        if value <= 0:
            raise self.fail(field, f"must be > 0, got {value}")
        return value

    def path(self, field: str, optional: bool = False) -> Optional[Path]:
        rel = self.get(field, str, None if optional else ...)
        if rel is None:
            return None
        root = self.json_path.parent.resolve()
        target = resolve_inside(root, rel)
        if target is None:
            raise self.fail(field, f"path '{rel}' leaves the bundle directory {root}: "
                            "keep every file inside the bundle")
        if not target.is_file():
            raise BundleError(f"{target}: file named by field '{field}' of {self.json_path} "
                              "is missing: restore it or fix the field")
        return target

    def floats(self, field: str, n: int) -> Tuple[float, ...]:
        values = self.get(field, list)
        if len(values) != n or not all(isinstance(v, (int, float)) for v in values):
            raise self.fail(field, f"must be a list of {n} numbers, got {json.dumps(values)}")
        return tuple(float(v) for v in values)


def _open_model(path: Path) -> Any:
    """Opens a .tflite file with the CPU interpreter, turning failures into a BundleError."""
    with open(path, "rb") as f:
        head = f.read(8)
    # Every TFLite flatbuffer carries the file identifier "TFL3" at bytes 4..8.
    if len(head) < 8 or head[4:8] != b"TFL3":
        raise BundleError(f"{path}: not a TFLite model (no TFL3 identifier): re-export it")
    try:
        return make_cpu_interpreter(path)
    except (ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BundleError(f"{path}: corrupt or truncated TFLite model ({first}): re-export it") from None


def _signature_io(path: Path, interp: Any, expected: Tuple[set, set]) -> Tuple[dict, dict]:
    """Returns (inputs, outputs) details of a step model keyed by signature names."""
    sigs = interp.get_signature_list()
    if "serving_default" not in sigs:
        raise BundleError(f"{path}: no 'serving_default' signature: export the step model "
                          "with the signature names of docs/bundle.md")
    runner = interp.get_signature_runner("serving_default")
    inputs, outputs = runner.get_input_details(), runner.get_output_details()
    want_in, want_out = expected
    if set(inputs) != want_in or set(outputs) != want_out:
        raise BundleError(
            f"{path}: signature has inputs {sorted(inputs)} and outputs {sorted(outputs)}, "
            f"expected {sorted(want_in)} -> {sorted(want_out)} (docs/bundle.md)")
    return inputs, outputs


def _size(shape: Any) -> int:
    return int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])


def load_bundle(path: "str | os.PathLike[str]") -> Bundle:
    """Loads a bundle directory and checks that its files agree with each other.

    Args:
      path: The bundle directory (or its bundle.json).

    Returns:
      The validated ``Bundle``.

    Raises:
      BundleError: With one line naming the file and field at fault and the fix.
    """
    root = Path(path)
    if root.name == "bundle.json":
        root = root.parent
    json_path = root / "bundle.json"
    if not root.is_dir():
        raise BundleError(f"{root}: bundle directory not found: pass the directory "
                          "that holds bundle.json")
    if not json_path.is_file():
        raise BundleError(f"{json_path}: missing: a bundle directory needs a bundle.json")
    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{json_path}: not valid JSON ({e}): fix or re-export it") from None
    if not isinstance(data, dict):
        raise BundleError(f"{json_path}: must hold a JSON object")
    r = _Reader(json_path, data)

    version = r.get("schema_version", int)
    if version != SCHEMA_VERSION:
        raise r.fail("schema_version", f"is {version}, this edgecap reads version "
                     f"{SCHEMA_VERSION}: re-export the bundle or upgrade edgecap")

    channels = r.positive("input.channels")
    inp = InputSpec(
        height=r.positive("input.height"),
        width=r.positive("input.width"),
        channels=channels,
        color_order=r.get("input.color_order", str, "RGB"),
        mean=r.floats("input.mean", channels),
        std=r.floats("input.std", channels),
    )
    if inp.color_order not in ("RGB", "BGR"):
        raise r.fail("input.color_order", f"must be RGB or BGR, got {inp.color_order!r}")
    if any(s == 0 for s in inp.std):
        raise r.fail("input.std", "must not contain 0")

    window = WindowSpec(
        frames=r.positive("window.frames"),
        stride=r.positive("window.stride"),
        sample_fps=r.get("window.sample_fps", float),
    )
    if window.sample_fps < 0:
        raise r.fail("window.sample_fps", "must be >= 0 (0 samples every frame)")
    tokens = Tokens(**{k: r.get(f"tokens.{k}", int) for k in ("pad", "bos", "eos", "unk")})
    feature_size = r.positive("feature_size")
    hidden_size = r.positive("rnn.hidden_size")
    max_len = r.positive("max_caption_length")

    encoder = r.path("encoder")
    reference = r.path("reference_encoder", optional=True)
    encoder_step = r.path("rnn.encoder_step")
    decoder_step = r.path("rnn.decoder_step")
    vocab_path = r.path("vocab")

    try:
        vocab = tuple(vocab_path.read_text(encoding="utf-8").splitlines())
    except UnicodeDecodeError:
        raise BundleError(f"{vocab_path}: not UTF-8 text: write one token a line") from None
    if not vocab:
        raise BundleError(f"{vocab_path}: empty vocabulary: write one token a line")
    for name, tid in tokens.__dict__.items():
        if not 0 <= tid < len(vocab):
            raise r.fail(f"tokens.{name}", f"is {tid}, outside the {len(vocab)} tokens of "
                         f"{vocab_path.name}: fix the id or the vocabulary")

    enc = _open_model(encoder)
    enc_in, enc_out = enc.get_input_details(), enc.get_output_details()
    if len(enc_in) != 1 or len(enc_out) != 1:
        raise BundleError(f"{encoder}: encoder must have one input and one output, "
                          f"has {len(enc_in)} and {len(enc_out)}")
    if enc_in[0]["dtype"] not in _QUANTIZED or enc_out[0]["dtype"] not in _QUANTIZED:
        raise BundleError(
            f"{encoder}: float encoder (input {np.dtype(enc_in[0]['dtype']).name}, output "
            f"{np.dtype(enc_out[0]['dtype']).name}): export it with full-integer (int8) "
            "quantization so it can run on an EdgeTPU")
    want = [1, inp.height, inp.width, inp.channels]
    if list(enc_in[0]["shape"]) != want:
        raise r.fail("input", f"says {want[1:]} but {encoder.name} takes "
                     f"{list(enc_in[0]['shape'])}: make them agree")
    if _size(enc_out[0]["shape"]) != feature_size:
        raise r.fail("feature_size", f"is {feature_size} but {encoder.name} outputs "
                     f"{_size(enc_out[0]['shape'])} features: make them agree")

    es_path, ds_path = encoder_step, decoder_step
    es_in, es_out = _signature_io(es_path, _open_model(es_path), _ENCODER_STEP_IO)
    if _size(es_in["feature"]["shape"]) != feature_size:
        raise BundleError(
            f"{es_path}: RNN input 'feature' has {_size(es_in['feature']['shape'])} values but "
            f"the encoder outputs {feature_size} (feature_size): retrain or re-export one of them")
    ds_in, ds_out = _signature_io(ds_path, _open_model(ds_path), _DECODER_STEP_IO)
    for path_, io in ((es_path, es_in), (es_path, es_out), (ds_path, ds_in), (ds_path, ds_out)):
        for key in ("h", "c", "h_out", "c_out"):
            if key in io and _size(io[key]["shape"]) != hidden_size:
                raise r.fail("rnn.hidden_size", f"is {hidden_size} but {path_.name} state "
                             f"'{key}' has {_size(io[key]['shape'])}: make them agree")
    logits = _size(ds_out["logits"]["shape"])
    if logits != len(vocab):
        raise BundleError(f"{vocab_path}: {len(vocab)} tokens but {ds_path.name} emits "
                          f"{logits} logits: use the vocabulary the decoder was trained with")

    return Bundle(
        root=root.resolve(),
        name=r.get("name", str, root.resolve().name),
        encoder=encoder,
        reference_encoder=reference,
        encoder_step=encoder_step,
        decoder_step=decoder_step,
        vocab=vocab,
        input=inp,
        feature_size=feature_size,
        hidden_size=hidden_size,
        window=window,
        max_caption_length=max_len,
        tokens=tokens,
        meta=data,
    )
