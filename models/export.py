"""TFLite export of a trained captioner into a bundle directory (docs/bundle.md).

Every model is converted from a function with named inputs and a dict of named
outputs, exported as the SavedModel signature ``serving_default``, so each file
carries that signature with those names; Keras 3 models do not convert reliably
through ``from_keras_model``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from tensorflow.lite.python import schema_py_generated as tfl_schema
from tensorflow.lite.tools import flatbuffer_utils

from edgecap_compile.int8_export import configure_full_int8
from models.architectures import ModelConfig, StepModels
from models.bundle_meta import TF_NORM, InputNorm

SCHEMA_VERSION = 1
# Normalisation the demo encoder's first layer expects: (pixel - 127.5) / 127.5.
PIXEL_MEAN = TF_NORM.mean[0]
PIXEL_STD = TF_NORM.std[0]
# The int8-weight step models' file names (bundle.json ``rnn.int8``).
INT8_STEP_FILES = {"encoder_step": "rnn_encoder_step_int8.tflite",
                   "decoder_step": "rnn_decoder_step_int8.tflite"}


def _convert(
    model: keras.Model,
    fn: Callable[..., Dict[str, tf.Tensor]],
    signature: Sequence[tf.TensorSpec],
    configure: Optional[Callable[[tf.lite.TFLiteConverter], None]] = None,
) -> bytes:
    # Through a Keras ExportArchive: it freezes the Keras 3 variables, which a plain
    # tf.saved_model.save leaves as resource reads that break int8 calibration.
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", fn, input_signature=list(signature))
    with tempfile.TemporaryDirectory() as saved:
        archive.write_out(saved, verbose=False)
        converter = tf.lite.TFLiteConverter.from_saved_model(saved)
        if configure is not None:
            configure(converter)
        return converter.convert()


def _convert_frame_encoder(cnn: keras.Model, size: int, configure=None) -> bytes:
    signature = [tf.TensorSpec([1, size, size, 3], tf.float32, name="frame")]
    return _convert(cnn, lambda frame: {"feature": cnn(frame, training=False)}, signature, configure)


def float_encoder(cnn: keras.Model, size: int) -> bytes:
    """Converts the frame CNN to a float32 TFLite model (the bundle's ``reference_encoder``)."""
    return _convert_frame_encoder(cnn, size)


def int8_encoder(cnn: keras.Model, size: int, calibration: np.ndarray) -> bytes:
    """Converts the frame CNN to a full-integer TFLite model with int8 input and output.

    Args:
      cnn: The trained frame CNN.
      size: Frame side.
      calibration: Normalised float frames ``[K,S,S,3]`` for the representative dataset.

    Returns:
      The model's bytes.
    """

    def representative() -> Iterator[List[np.ndarray]]:
        for frame in calibration:
            yield [frame[None].astype(np.float32)]

    return _convert_frame_encoder(
        cnn, size, lambda converter: configure_full_int8(converter, representative))


def int8_step(float_step: bytes) -> bytes:
    """Rewrites a float step model with int8 fully-connected weights (TFLite's hybrid form).

    Each FULLY_CONNECTED weight matrix becomes int8, symmetric, one scale per
    tensor; activations stay float and the kernel quantizes them on the fly
    (dynamic-range quantization). Per-tensor, not per-channel, scales keep
    the op at version 3, older than the tflite_runtime 2.5 of Coral boards
    (per-channel hybrid came later; not run here on 2.5 itself); the demo's
    captions agree with the float step's on every held-out clip
    (docs/bundle.md). The decoder's word embedding (GATHER) stays float: it
    is a few KB. Rewriting the float model, rather than converting the Keras
    one again, makes the int8 step of any shipped bundle, and keeps every
    other op and the signature as they were.

    Args:
      float_step: A float step model's bytes (``step_models``).

    Returns:
      The int8-weight model's bytes.
    """
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(float_step))
    fully_connected = tfl_schema.BuiltinOperator.FULLY_CONNECTED
    rewritten = set()
    for graph in model.subgraphs:
        for op in graph.operators:
            code = model.operatorCodes[op.opcodeIndex]
            if max(code.builtinCode, code.deprecatedBuiltinCode) != fully_connected:
                continue
            tensor = graph.tensors[op.inputs[1]]
            buffer = model.buffers[tensor.buffer]
            if tensor.buffer in rewritten or tensor.type != tfl_schema.TensorType.FLOAT32 or buffer.data is None:
                continue  # shared weights done once; a computed weight input stays float
            weights = np.frombuffer(bytes(buffer.data), np.float32)
            scale = max(float(np.abs(weights).max()), 1e-12) / 127.0
            quantized = np.clip(np.round(weights / scale), -127, 127).astype(np.int8)
            buffer.data = np.frombuffer(quantized.tobytes(), np.uint8)
            tensor.type = tfl_schema.TensorType.INT8
            tensor.quantization = tfl_schema.QuantizationParametersT()
            tensor.quantization.scale = [scale]
            tensor.quantization.zeroPoint = [0]
            code.version = max(code.version, 3)  # float input, int8 weights: the hybrid kernel
            rewritten.add(tensor.buffer)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def step_models(rnn: keras.Model, config: ModelConfig) -> Dict[str, bytes]:
    """Converts the trained RNN into TFLite step models with explicit state: float, and int8-weight.

    Returns:
      ``{"encoder_step", "decoder_step", "encoder_step_int8", "decoder_step_int8"}`` -> bytes.
    """
    steps = StepModels(rnn)
    f, hs = config.feature_size, config.hidden_size
    state = [tf.TensorSpec([1, hs], tf.float32, name="h"), tf.TensorSpec([1, hs], tf.float32, name="c")]
    floats = {
        "encoder_step": _convert(
            rnn, steps.encoder_step, [tf.TensorSpec([1, f], tf.float32, name="feature")] + state
        ),
        "decoder_step": _convert(
            rnn, steps.decoder_step, [tf.TensorSpec([1], tf.int32, name="word")] + state
        ),
    }
    return {**floats, **{f"{key}_int8": int8_step(data) for key, data in floats.items()}}


def write_bundle(
    out_dir: Path,
    name: str,
    config: ModelConfig,
    vocab: Sequence[str],
    models: Dict[str, bytes],
    sample_fps: float,
    tokens: Dict[str, int],
    provenance: Dict[str, object],
    norm: InputNorm = TF_NORM,
    extra: Optional[Dict[str, object]] = None,
) -> Path:
    """Writes the model files, ``vocab.txt`` and ``bundle.json`` of a bundle.

    Args:
      out_dir: Bundle directory, created if missing.
      name: Bundle name.
      config: Model sizes.
      vocab: Tokens, id order.
      models: Bytes of ``encoder``, ``encoder_step``, ``decoder_step`` and, optionally,
        ``reference_encoder`` and the int8-weight ``encoder_step_int8`` and
        ``decoder_step_int8`` (``int8_step``).
      sample_fps: Rate frames are sampled at.
      tokens: Special token ids (pad, bos, eos, unk).
      provenance: Recipe and seed the bundle came from.
      norm: Channel order and normalisation the encoder's first layer expects.
      extra: Further top-level fields (e.g. ``weights``).

    Returns:
      The path of ``bundle.json``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "encoder": "encoder.tflite",
        "reference_encoder": "encoder_float.tflite",
        "encoder_step": "rnn_encoder_step.tflite",
        "decoder_step": "rnn_decoder_step.tflite",
        "encoder_step_int8": INT8_STEP_FILES["encoder_step"],
        "decoder_step_int8": INT8_STEP_FILES["decoder_step"],
    }
    files = {key: name for key, name in files.items() if key in models}
    for key, filename in files.items():
        (out_dir / filename).write_bytes(models[key])
    (out_dir / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    meta = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "encoder": files["encoder"],
        **({"reference_encoder": files["reference_encoder"]} if "reference_encoder" in files else {}),
        "rnn": {
            "encoder_step": files["encoder_step"],
            "decoder_step": files["decoder_step"],
            "hidden_size": config.hidden_size,
            **({"int8": {"encoder_step": files["encoder_step_int8"],
                         "decoder_step": files["decoder_step_int8"]}}
               if "encoder_step_int8" in files else {}),
        },
        "vocab": "vocab.txt",
        "input": norm.as_input(config.input_size),
        "feature_size": config.feature_size,
        "window": {
            "frames": config.window_frames,
            "stride": config.window_frames,
            "sample_fps": sample_fps,
        },
        "max_caption_length": config.max_caption_length,
        "tokens": dict(tokens),
        "provenance": dict(provenance),
        **(extra or {}),
    }
    path = out_dir / "bundle.json"
    path.write_text(json.dumps(meta, indent=2) + "\n")
    return path
