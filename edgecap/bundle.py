"""Loads and validates a model bundle (schema version 1, see docs/bundle.md)."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import msgspec
import numpy as np

from edgecap import files, schema
from edgecap.domain import KINDS, Calibration, Domain, FeatureThreshold, Threshold
from edgecap.errors import BundleError
from edgecap.modelfile import ModelFile, open_model
from edgecap.tflite_verify import verify_tflite

try:
    from typing import Annotated, Literal
except ImportError:  # pragma: no cover - Python < 3.9 is not supported
    from typing_extensions import Annotated, Literal  # type: ignore[assignment]

SCHEMA_VERSION = 1
PLANS_DIR = "plans"  # plans compiled ahead of time, one directory per board
_QUANTIZED = ("int8", "uint8")
_ENCODER_STEP_IO = ({"feature", "h", "c"}, {"h_out", "c_out"})
_DECODER_STEP_IO = ({"word", "h", "c"}, {"logits", "h_out", "c_out"})


def demo_dir(package: Path) -> Path:
    """Returns where the shipped demo (bundle, sample clip, its ground truth) lies.

    A wheel carries it as ``edgecap/demo`` (pyproject maps ``models/demo`` there);
    a source checkout, editable installs included, has only ``models/demo``.

    Args:
      package: The directory of the ``edgecap`` package.

    Returns:
      ``package/demo`` where it exists, else the checkout's ``models/demo``.
    """
    packaged = package / "demo"
    return packaged if packaged.is_dir() else package.parent / "models" / "demo"


DEMO_DIR = demo_dir(Path(__file__).resolve().parent)


def unusable_name(name: str) -> Optional[str]:
    """Says why ``name`` cannot name a file of a bundle or plan (a NUL or other control
    character, an unencodable character, a part over 255 bytes), or returns None."""
    if "\0" in name:
        return "it contains a NUL byte"
    if any(ord(c) < 0x20 or c == "\x7f" for c in name):  # legal on Linux, but no bundle's or plan's name
        return "it contains a control character"
    try:
        parts = [os.fsencode(part) for part in Path(name).parts]
    except UnicodeError:
        return "it has characters no file name can hold"
    if any(len(part) > 255 for part in parts):
        return "a part of it is over 255 bytes"
    return None


def quote_name(name: str) -> str:
    """``name`` quoted for a message, cut to 80 characters."""
    return repr(name if len(name) <= 80 else name[:77] + "...")


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
class RnnSteps:
    """The two RNN step models the CPU runs, as absolute paths."""

    encoder_step: Path
    decoder_step: Path


@dataclass(frozen=True)
class Bundle:
    """A validated model bundle; every path is absolute and inside ``root``.

    ``encoder_model``, ``encoder_step_model`` and ``decoder_step_model`` record
    what validation read from each model file (tensors, op count, SHA-256), so
    later code never opens or hashes them again to learn it. ``plans`` maps a
    board name to the directory of a plan compiled ahead of time into the
    bundle (``plans/<board>/plan.json``, ``edgecap compile --into-bundle``);
    they are read only when chosen (``edgecap.planner``). ``weights`` is
    ``trained``, ``imagenet`` (pretrained encoder, untrained decoder) or
    ``random``: only trained captions mean anything. ``candidates`` maps a
    board name to the directories of the other plans compiled for it, near
    the best (``plans/<board>/candidates/<name>/plan.json``): a running board
    that measures its stages re-chooses among them, as it cannot compile.
    ``edgetpu_encoder`` is an EdgeTPU-compiled twin of the encoder
    (bundle.json ``edgetpu_encoder``), or None; ``encoder`` itself may be
    compiled (a compiled-only bundle): ``cpu_encoder`` and
    ``compiled_encoder`` say which the bundle has.
    ``int8_steps`` are the step models with int8 weights (``rnn.int8``), which
    run instead of the float ones unless asked (``steps``); None when the
    bundle ships none. ``domain`` is what the model knows (kind ``unknown``
    when bundle.json does not say) and ``calibration`` the thresholds that
    tell its world from others (``edgecap.domain``), None when it has none.
    """

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
    encoder_model: ModelFile
    encoder_step_model: ModelFile
    decoder_step_model: ModelFile
    plans: Dict[str, Path] = field(default_factory=dict)
    weights: str = "trained"
    candidates: Dict[str, Tuple[Path, ...]] = field(default_factory=dict)
    edgetpu_encoder: Optional[Path] = None
    edgetpu_encoder_model: Optional[ModelFile] = None

    @property
    def cpu_encoder(self) -> Optional[ModelFile]:
        """The encoder a CPU runs, or None for a compiled-only bundle."""
        return None if self.encoder_model.edgetpu else self.encoder_model

    @property
    def compiled_encoder(self) -> Optional[ModelFile]:
        """The EdgeTPU-compiled encoder (``edgetpu_encoder``, or a compiled ``encoder``), or None."""
        if self.edgetpu_encoder_model is not None:
            return self.edgetpu_encoder_model
        return self.encoder_model if self.encoder_model.edgetpu else None
    int8_steps: Optional[RnnSteps] = None
    domain: Domain = Domain()
    calibration: Optional[Calibration] = None

    def steps(self, float_rnn: bool = False) -> RnnSteps:
        """Returns the step models to run: the int8 ones where shipped, unless ``float_rnn``."""
        if self.int8_steps is not None and not float_rnn:
            return self.int8_steps
        return RnnSteps(self.encoder_step, self.decoder_step)

    def detokenize(self, ids: List[int]) -> str:
        """Returns the sentence for token ids, dropping special tokens."""
        special = {self.tokens.pad, self.tokens.bos, self.tokens.eos}
        return " ".join(self.vocab[i] for i in ids if i not in special)


def default_bundle() -> Path:
    """Returns the bundle to use when none is given: $EDGECAP_BUNDLE, else the shipped demo."""
    env = os.environ.get("EDGECAP_BUNDLE")
    return Path(env) if env else DEMO_DIR / "bundle"


_FIX = "fix it or re-export the bundle (docs/bundle.md)"
_Mean = Annotated[float, msgspec.Meta(ge=-1e6, le=1e6)]
_Std = Annotated[float, msgspec.Meta(gt=0.0, le=1e6)]
_TokenId = Annotated[int, msgspec.Meta(ge=0, le=schema.MAX_COUNT)]


class _InputDoc(msgspec.Struct, forbid_unknown_fields=True):
    height: Annotated[int, msgspec.Meta(ge=1, le=8192)]
    width: Annotated[int, msgspec.Meta(ge=1, le=8192)]
    channels: Annotated[int, msgspec.Meta(ge=1, le=4)]
    mean: Tuple[_Mean, ...]
    std: Tuple[_Std, ...]
    color_order: Literal["RGB", "BGR"] = "RGB"


class _StepsDoc(msgspec.Struct, forbid_unknown_fields=True):
    encoder_step: schema.Name
    decoder_step: schema.Name


class _RnnDoc(msgspec.Struct, forbid_unknown_fields=True):
    encoder_step: schema.Name
    decoder_step: schema.Name
    hidden_size: Annotated[int, msgspec.Meta(ge=1, le=65536)]
    int8: Optional[_StepsDoc] = None


class _WindowDoc(msgspec.Struct, forbid_unknown_fields=True):
    frames: Annotated[int, msgspec.Meta(ge=1, le=10_000)]
    stride: Annotated[int, msgspec.Meta(ge=1, le=10_000)]
    sample_fps: schema.Fps


class _TokensDoc(msgspec.Struct, forbid_unknown_fields=True):
    pad: _TokenId
    bos: _TokenId
    eos: _TokenId
    unk: _TokenId


_Text = Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]
_Percentile = Annotated[float, msgspec.Meta(ge=0.0, le=100.0)]


class _DomainDoc(msgspec.Struct, forbid_unknown_fields=True):
    kind: Annotated[str, msgspec.Meta(max_length=100)]  # one of domain.KINDS: checked by _check_domain, saying which
    about: _Text


class _ThresholdDoc(msgspec.Struct, forbid_unknown_fields=True):
    # A mean log-probability: finite and at most 0.
    unknown_below: Annotated[float, msgspec.Meta(ge=-1e6, le=0.0)]
    statistic: str = ""
    percentile: Optional[_Percentile] = None
    heldout_windows: Optional[schema.Positive] = None


class _FeatureDoc(msgspec.Struct, forbid_unknown_fields=True):
    unknown_below: Annotated[float, msgspec.Meta(ge=-1.0, le=1.0)]  # a cosine
    centroid: schema.Name
    statistic: str = ""
    percentile: Optional[_Percentile] = None
    heldout_windows: Optional[schema.Positive] = None


class _CalibrationDoc(msgspec.Struct, forbid_unknown_fields=True):
    confidence: _ThresholdDoc
    feature: Optional[_FeatureDoc] = None


class _BundleDoc(msgspec.Struct):
    # Unknown top-level keys are allowed: bundles carry provenance and notes.
    schema_version: int
    encoder: schema.Name
    rnn: _RnnDoc
    vocab: schema.Name
    input: _InputDoc
    feature_size: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)]
    window: _WindowDoc
    max_caption_length: Annotated[int, msgspec.Meta(ge=1, le=1000)]
    tokens: _TokensDoc
    name: Optional[schema.Name] = None
    reference_encoder: Optional[schema.Name] = None
    # The EdgeTPU-compiled twin of `encoder` (edgetpu_compiler's output).
    edgetpu_encoder: Optional[schema.Name] = None
    # Only "trained" captions mean anything; paper-scale bundles built with
    # random weights exist to measure speed and exactness.
    weights: Literal["trained", "imagenet", "random"] = "trained"
    # What the model knows and when a window is not of it (docs/bundle.md); absent in older bundles.
    domain: Optional[_DomainDoc] = None
    calibration: Optional[_CalibrationDoc] = None


class _VersionDoc(msgspec.Struct):
    schema_version: Any = None


def _file(json_path: Path, field: str, rel: Optional[str]) -> Optional[Path]:
    """Resolves a file named by bundle.json inside the bundle directory."""
    if rel is None:
        return None
    root = json_path.parent.resolve()
    why = unusable_name(rel)
    if why is not None:
        raise BundleError(f"{json_path}: field '{field}' path {quote_name(rel)} is not a usable file name "
                          f"({why}): name a file inside the bundle")
    target = resolve_inside(root, rel)
    if target is None:
        raise BundleError(f"{json_path}: field '{field}' path '{rel}' leaves the bundle "
                          f"directory {root}: keep every file inside the bundle")
    if target.is_dir():
        raise BundleError(f"{target}: field '{field}' of {json_path} names a directory: "
                          "name the file")
    if target.exists() and not target.is_file():  # never opened: a FIFO would block, a device never end
        raise BundleError(f"{target}: field '{field}' of {json_path} names a FIFO, device or socket, "
                          "not a regular file: name the file")
    if not target.is_file():
        raise BundleError(f"{target}: file named by field '{field}' of {json_path} "
                          "is missing: restore it or fix the field")
    return target


def _bundled_plans(root: Path) -> Dict[str, Path]:
    """Board name -> plan directory, for each ``plans/<board>/plan.json`` inside the bundle."""
    found = {}
    for plan_json in sorted((root / PLANS_DIR).glob("*/plan.json")):
        inside = resolve_inside(root, plan_json.relative_to(root).as_posix())
        if inside is not None:  # a symlink out of the bundle is not the bundle's plan
            found[plan_json.parent.name] = inside.parent
    return found


def _bundled_candidates(root: Path) -> Dict[str, Tuple[Path, ...]]:
    """Board name -> candidate plan directories, ``plans/<board>/candidates/*/plan.json``."""
    found: Dict[str, Tuple[Path, ...]] = {}
    for plan_json in sorted((root / PLANS_DIR).glob("*/candidates/*/plan.json")):
        inside = resolve_inside(root, plan_json.relative_to(root).as_posix())
        if inside is not None:  # a symlink out of the bundle is not the bundle's plan
            board = plan_json.parent.parent.parent.name
            found[board] = found.get(board, ()) + (inside.parent,)
    return found


def _open_model(path: Path) -> Tuple[ModelFile, Any]:
    """Opens a .tflite file once on the CPU, turning failures into a BundleError.

    ``open_model`` reads the file once and verifies it (the TFL3 identifier
    included) before the interpreter sees it.
    """
    try:
        return open_model(path)
    except (ValueError, RuntimeError, MemoryError) as e:  # MemoryError: the kernel's std::bad_alloc
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BundleError(f"{path}: the TFLite interpreter refused the model ({first}); re-export it") from None


def _open_step_model(path: Path, field: str) -> Tuple[ModelFile, Any]:
    """Opens an RNN step model; they run on the CPU, so a compiled one is refused."""
    model, interp = _open_model(path)
    if model.edgetpu:
        raise BundleError(f"{path}: field '{field}' names an EdgeTPU-compiled model, but the RNN step "
                          "models run on the CPU: name the model as exported, before edgetpu_compiler")
    return model, interp


def _check_twin(json_path: Path, cpu: ModelFile, compiled: ModelFile) -> None:
    """Checks that the compiled encoder takes and gives what the CPU encoder does."""
    if not compiled.edgetpu:
        raise BundleError(f"{compiled.path}: field 'edgetpu_encoder' of {json_path} names a model "
                          "edgetpu_compiler did not compile (no edgetpu-custom-op): compile the "
                          "encoder with edgetpu_compiler and name its _edgetpu.tflite output")
    if cpu.edgetpu:
        raise BundleError(f"{json_path}: fields 'encoder' and 'edgetpu_encoder' both name "
                          "EdgeTPU-compiled models: name the CPU model (before edgetpu_compiler) in 'encoder'")
    for kind, mine, theirs in (("input", cpu.inputs, compiled.inputs), ("output", cpu.outputs, compiled.outputs)):
        a = [(t.shape, t.dtype, t.quantization) for t in mine]
        b = [(t.shape, t.dtype, t.quantization) for t in theirs]
        if a != b:
            def says(ts: Any) -> str:
                return ", ".join(f"{t.dtype}{list(t.shape)} scale {t.scale:g} zero point {t.zero_point}"
                                 for t in ts)
            raise BundleError(f"{compiled.path}: {kind} is {says(theirs)} but the encoder's is {says(mine)}: "
                              "compile 'edgetpu_encoder' from the bundle's own encoder")


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


def _same_io(json_path: Path, field: str, path: Path, expected: Tuple[set, set],
             like: Path, like_io: Tuple[dict, dict]) -> None:
    """Opens a step model that stands in for another and checks it has the same inputs and outputs."""
    _, interp = _open_model(path)
    io = _signature_io(path, interp, expected)
    for details, like_details in zip(io, like_io):
        for key, d in details.items():
            want = like_details[key]
            if list(d["shape"]) != list(want["shape"]) or d["dtype"] != want["dtype"]:
                raise BundleError(
                    f"{json_path}: field '{field}' names {path.name}, whose '{key}' is "
                    f"{list(d['shape'])} {np.dtype(d['dtype']).name} where {like.name} has "
                    f"{list(want['shape'])} {np.dtype(want['dtype']).name}: export both from one model")


@dataclass(frozen=True)
class _Files:
    """The files bundle.json names, each resolved inside the bundle and found to be a regular file."""

    encoder: Path
    reference_encoder: Optional[Path]
    edgetpu_encoder: Optional[Path]
    encoder_step: Path
    decoder_step: Path
    vocab: Path


@dataclass(frozen=True)
class _Steps:
    """The float RNN step models, opened, with each signature's (inputs, outputs) details."""

    encoder_step: ModelFile
    encoder_io: Tuple[dict, dict]
    decoder_step: ModelFile
    decoder_io: Tuple[dict, dict]


def _json_path(path: "str | os.PathLike[str]") -> Path:
    """Returns the bundle.json of a bundle directory (or of the bundle.json itself), checking both exist."""
    root = Path(path)
    if root.name == "bundle.json":
        root = root.parent
    json_path = root / "bundle.json"
    if not root.is_dir():
        raise BundleError(f"{root}: bundle directory not found: pass the directory "
                          "that holds bundle.json")
    if not json_path.exists():
        raise BundleError(f"{json_path}: missing: a bundle directory needs a bundle.json")
    return json_path


def _decode(json_path: Path) -> Tuple[_BundleDoc, Dict[str, Any]]:
    """Reads bundle.json once; returns its typed document and the whole of it (unknown keys too)."""
    data = files.read_bytes(json_path, what="bundle.json", fix=_FIX, error=BundleError)
    # The version first: another version's fields would be refused one by one, not as a version.
    try:
        version = msgspec.json.decode(data, type=_VersionDoc).schema_version
    except (msgspec.MsgspecError, RecursionError):
        version = SCHEMA_VERSION  # not a JSON object: the full decode below says what is wrong
    if isinstance(version, int) and not isinstance(version, bool) and version != SCHEMA_VERSION:
        raise BundleError(f"{json_path}: field 'schema_version' is {version}, this edgecap reads "
                          f"version {SCHEMA_VERSION}: re-export the bundle or upgrade edgecap")
    doc = schema.decode(data, _BundleDoc, where=str(json_path), fix=_FIX, error=BundleError)
    # Whole document, unknown keys included (meta): they too must be valid JSON text.
    raw = schema.decode(data, Dict[str, Any], where=str(json_path), fix=_FIX, error=BundleError)
    return doc, raw


def _input_spec(json_path: Path, d: _InputDoc) -> InputSpec:
    """Checks that the normalization gives one mean and one std per channel."""
    for name, values in (("mean", d.mean), ("std", d.std)):
        if len(values) != d.channels:
            raise BundleError(f"{json_path}: field 'input.{name}' must be a list of {d.channels} "
                              f"numbers, got {list(values)}")
    return InputSpec(d.height, d.width, d.channels, d.color_order, tuple(d.mean), tuple(d.std))


def _named_files(json_path: Path, doc: _BundleDoc) -> _Files:
    """Resolves every file bundle.json names (but the int8 steps': ``_check_int8_steps``)."""
    return _Files(
        encoder=_file(json_path, "encoder", doc.encoder),
        reference_encoder=_file(json_path, "reference_encoder", doc.reference_encoder),
        edgetpu_encoder=_file(json_path, "edgetpu_encoder", doc.edgetpu_encoder),
        encoder_step=_file(json_path, "rnn.encoder_step", doc.rnn.encoder_step),
        decoder_step=_file(json_path, "rnn.decoder_step", doc.rnn.decoder_step),
        vocab=_file(json_path, "vocab", doc.vocab),
    )


def _vocabulary(json_path: Path, vocab_path: Path, tokens: Tokens) -> Tuple[str, ...]:
    """Reads the vocabulary and checks that every special token id is one of its tokens."""
    vocab_bytes = files.read_bytes(vocab_path, what="vocabulary", fix="write one token a line",
                                   kind="text", error=BundleError)
    try:
        vocab = tuple(vocab_bytes.decode("utf-8").splitlines())
    except UnicodeDecodeError:
        raise BundleError(f"{vocab_path}: not UTF-8 text: write one token a line") from None
    if not vocab:
        raise BundleError(f"{vocab_path}: empty vocabulary: write one token a line")
    for name, tid in tokens.__dict__.items():
        if not 0 <= tid < len(vocab):
            raise BundleError(f"{json_path}: field 'tokens.{name}' is {tid}, outside the "
                              f"{len(vocab)} tokens of {vocab_path.name}: fix the id or the vocabulary")
    if tokens.bos == tokens.eos:  # decoding would take the start token for the end of the caption
        raise BundleError(f"{json_path}: fields 'tokens.bos' and 'tokens.eos' are both {tokens.bos}: "
                          "give the start and the end of a caption different ids")
    return vocab


def _check_reference(path: Path) -> None:
    """Checks the float reference encoder is a TFLite file.

    It is opened only when asked for (``--reference-encoder``), but checked
    now: a bad file must fail here, not after a run has started.
    """
    data = files.read_bytes(path, what="reference encoder", fix="restore it or re-export the bundle",
                            error=BundleError, kind="model")
    verify_tflite(data, str(path), error=BundleError, fix="re-export the bundle")


def _check_encoder(json_path: Path, named: _Files, inp: InputSpec,
                   feature_size: int) -> Tuple[ModelFile, Optional[ModelFile]]:
    """Opens the encoder (and its compiled twin) and checks it is full-integer and fits ``input`` and
    ``feature_size``; returns the encoder's and the twin's ``ModelFile``."""
    encoder = named.encoder
    enc, _ = _open_model(encoder)
    twin_model = None
    if named.edgetpu_encoder is not None:
        twin_model, _ = _open_model(named.edgetpu_encoder)
        _check_twin(json_path, enc, twin_model)
    if named.reference_encoder is not None:
        _check_reference(named.reference_encoder)
    if len(enc.inputs) != 1 or len(enc.outputs) != 1:
        raise BundleError(f"{encoder}: encoder must have one input and one output, "
                          f"has {len(enc.inputs)} and {len(enc.outputs)}")
    enc_in, enc_out = enc.inputs[0], enc.outputs[0]
    if enc_in.dtype not in _QUANTIZED or enc_out.dtype not in _QUANTIZED:
        raise BundleError(
            f"{encoder}: float encoder (input {enc_in.dtype}, output {enc_out.dtype}): export it "
            "with full-integer (int8) quantization so it can run on an EdgeTPU")
    want = [1, inp.height, inp.width, inp.channels]
    if list(enc_in.shape) != want:
        raise BundleError(f"{json_path}: field 'input' says {want[1:]} but {encoder.name} takes "
                          f"{list(enc_in.shape)}: make them agree")
    if _size(enc_out.shape) != feature_size:
        raise BundleError(f"{json_path}: field 'feature_size' is {feature_size} but {encoder.name} "
                          f"outputs {_size(enc_out.shape)} features: make them agree")
    return enc, twin_model


def _check_steps(json_path: Path, named: _Files, feature_size: int, hidden_size: int,
                 vocab: Tuple[str, ...]) -> _Steps:
    """Opens the RNN step models and checks their signatures against the encoder, ``hidden_size`` and the
    vocabulary."""
    es_path, ds_path = named.encoder_step, named.decoder_step
    es_model, es_interp = _open_step_model(es_path, "rnn.encoder_step")
    es_in, es_out = _signature_io(es_path, es_interp, _ENCODER_STEP_IO)
    if _size(es_in["feature"]["shape"]) != feature_size:
        raise BundleError(
            f"{es_path}: RNN input 'feature' has {_size(es_in['feature']['shape'])} values but "
            f"the encoder outputs {feature_size} (feature_size): retrain or re-export one of them")
    ds_model, ds_interp = _open_step_model(ds_path, "rnn.decoder_step")
    ds_in, ds_out = _signature_io(ds_path, ds_interp, _DECODER_STEP_IO)
    for path_, io in ((es_path, es_in), (es_path, es_out), (ds_path, ds_in), (ds_path, ds_out)):
        for key in ("h", "c", "h_out", "c_out"):
            if key in io and _size(io[key]["shape"]) != hidden_size:
                raise BundleError(f"{json_path}: field 'rnn.hidden_size' is {hidden_size} but "
                                  f"{path_.name} state '{key}' has {_size(io[key]['shape'])}: "
                                  "make them agree")
    logits = _size(ds_out["logits"]["shape"])
    if logits != len(vocab):
        raise BundleError(f"{named.vocab}: {len(vocab)} tokens but {ds_path.name} emits "
                          f"{logits} logits: use the vocabulary the decoder was trained with")
    return _Steps(es_model, (es_in, es_out), ds_model, (ds_in, ds_out))


def _check_int8_steps(json_path: Path, int8: Optional[_StepsDoc], named: _Files,
                      steps: _Steps) -> Optional[RnnSteps]:
    """Resolves the int8-weight step models (``rnn.int8``), if named, and checks they take and give
    what the float ones do."""
    if int8 is None:
        return None
    int8_steps = RnnSteps(_file(json_path, "rnn.int8.encoder_step", int8.encoder_step),
                          _file(json_path, "rnn.int8.decoder_step", int8.decoder_step))
    _same_io(json_path, "rnn.int8.encoder_step", int8_steps.encoder_step, _ENCODER_STEP_IO,
             named.encoder_step, steps.encoder_io)
    _same_io(json_path, "rnn.int8.decoder_step", int8_steps.decoder_step, _DECODER_STEP_IO,
             named.decoder_step, steps.decoder_io)
    return int8_steps


def _check_domain(json_path: Path, doc: _BundleDoc, feature_size: int) -> Tuple[Domain, Optional[Calibration]]:
    """Reads what the model knows (``domain``) and its calibration, with the feature centroid's file.

    The types and ranges were checked by the decode; here, the centroid: a
    ``.npy`` file inside the bundle of ``feature_size`` finite values, not all 0.
    """
    if doc.domain is not None and doc.domain.kind not in KINDS:
        raise BundleError(f"{json_path}: field 'domain.kind' is {doc.domain.kind!r}: say 'synthetic' (a made-up "
                          "world) or 'real' (docs/bundle.md)")
    domain = Domain(doc.domain.kind, doc.domain.about) if doc.domain is not None else Domain()
    if doc.calibration is None:
        return domain, None
    c = doc.calibration.confidence
    confidence = Threshold(c.unknown_below, c.statistic, c.percentile, c.heldout_windows)
    f = doc.calibration.feature
    if f is None:
        return domain, Calibration(confidence)
    field_ = "calibration.feature.centroid"
    path = _file(json_path, field_, f.centroid)
    assert path is not None
    data = files.read_bytes(path, what="feature centroid", fix="restore it or re-export the bundle",
                            error=BundleError)
    try:
        centroid = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError):
        raise BundleError(f"{path}: field '{field_}' of {json_path} names a file that is not a NumPy .npy array: "
                          "save the centroid with numpy.save") from None
    if centroid.dtype.kind not in "fiu" or centroid.size != feature_size or centroid.ndim > 2:
        raise BundleError(f"{path}: field '{field_}' of {json_path} holds {centroid.dtype} {list(centroid.shape)}, "
                          f"not the {feature_size} numbers of the encoder's feature (feature_size): "
                          "save the centroid of this encoder's features")
    centroid = centroid.astype(np.float64).reshape(-1)
    norm = float(np.linalg.norm(centroid)) if np.all(np.isfinite(centroid)) else float("nan")
    if not np.isfinite(norm) or norm == 0.0:
        raise BundleError(f"{path}: field '{field_}' of {json_path} holds a centroid with a non-finite value "
                          "or all zeros: save the mean of held-out windows' features")
    feature = FeatureThreshold(f.unknown_below, f.statistic, f.percentile, f.heldout_windows,
                               centroid=(centroid / norm).astype(np.float32), centroid_file=path)
    return domain, Calibration(confidence, feature)


def load_bundle(path: "str | os.PathLike[str]") -> Bundle:
    """Loads a bundle directory and checks that its files agree with each other.

    Every check runs here, once, in the order a part depends on the one before
    (bundle.json, the files it names, the vocabulary, the encoder, the RNN
    steps); what comes out is a ``Bundle`` that later code uses without checking again.

    Args:
      path: The bundle directory (or its bundle.json).

    Returns:
      The validated ``Bundle``.

    Raises:
      BundleError: With one line naming the file and field at fault and the fix.
    """
    json_path = _json_path(path)
    doc, meta = _decode(json_path)
    inp = _input_spec(json_path, doc.input)
    named = _named_files(json_path, doc)
    tokens = Tokens(doc.tokens.pad, doc.tokens.bos, doc.tokens.eos, doc.tokens.unk)
    vocab = _vocabulary(json_path, named.vocab, tokens)
    encoder, twin = _check_encoder(json_path, named, inp, doc.feature_size)
    steps = _check_steps(json_path, named, doc.feature_size, doc.rnn.hidden_size, vocab)
    int8_steps = _check_int8_steps(json_path, doc.rnn.int8, named, steps)
    domain, calibration = _check_domain(json_path, doc, doc.feature_size)

    root = json_path.parent.resolve()
    return Bundle(
        root=root,
        name=doc.name or root.name,
        encoder=named.encoder,
        reference_encoder=named.reference_encoder,
        encoder_step=named.encoder_step,
        decoder_step=named.decoder_step,
        vocab=vocab,
        input=inp,
        feature_size=doc.feature_size,
        hidden_size=doc.rnn.hidden_size,
        window=WindowSpec(doc.window.frames, doc.window.stride, doc.window.sample_fps),
        max_caption_length=doc.max_caption_length,
        tokens=tokens,
        meta=meta,
        encoder_model=encoder,
        encoder_step_model=steps.encoder_step,
        decoder_step_model=steps.decoder_step,
        plans=_bundled_plans(root),
        candidates=_bundled_candidates(root),
        weights=doc.weights,
        edgetpu_encoder=named.edgetpu_encoder,
        edgetpu_encoder_model=twin,
        int8_steps=int8_steps,
        domain=domain,
        calibration=calibration,
    )
