"""Full-integer (int8) TFLite export of a Keras model, for fixtures and benchmark models.

Needs TensorFlow (``pip install -e .[train]``); nothing else in edgecap_compile
imports this module, so the compiler itself runs without TensorFlow.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, List, Sequence

import numpy as np


def configure_full_int8(converter: Any,
                        representative: Callable[[], Iterable[List[np.ndarray]]]) -> None:
    """Sets a converter up for the EdgeTPU: every op int8 builtin, int8 input and output.

    Args:
      converter: A ``tf.lite.TFLiteConverter``.
      representative: Yields ``[input]`` lists of float32 samples from which the
        quantization ranges are measured.
    """
    import tensorflow as tf

    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = tf.int8
    converter.inference_output_type = tf.int8


def export_int8(model, input_shape: Sequence[int], samples: int = 4, seed: int = 0,
                low: float = -1.0, high: float = 1.0) -> bytes:
    """Converts a Keras model to a full-int8 TFLite flatbuffer with batch size 1.

    Args:
      model: A built Keras model with one image input.
      input_shape: Input shape without the batch dimension, e.g. ``(224, 224, 3)``.
      samples: Random calibration images for the quantization ranges.
      seed: Seed of the calibration images.
      low: Smallest calibration pixel value.
      high: Largest calibration pixel value.

    Returns:
      The .tflite bytes: int8 input and output, every op int8 builtin.
    """
    import keras
    import tensorflow as tf

    shape = (1, *input_shape)
    if tuple(model.inputs[0].shape) == shape:
        fixed = model  # already static: keeps its input's name
    else:
        # A fixed batch of one: the TPU compiler and the segment writer want static shapes.
        inputs = keras.Input(shape=tuple(input_shape), batch_size=1)
        fixed = keras.Model(inputs, model(inputs, training=False))
    rng = np.random.default_rng(seed)

    def representative():
        for _ in range(samples):
            yield [rng.uniform(low, high, size=shape).astype(np.float32)]

    converter = tf.lite.TFLiteConverter.from_keras_model(fixed)
    configure_full_int8(converter, representative)
    return converter.convert()
