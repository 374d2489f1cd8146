"""Writes tiny_encoder.tflite: a full-integer CNN with a skip connection, for runtime tests.

Run with TensorFlow (the train extra): /work/venv-train/bin/python tests/data/runtime/make_tiny_encoder.py
The skip connection makes a tensor pass through a middle stage when the model is split.
"""

from pathlib import Path

import numpy as np
import tensorflow as tf

HERE = Path(__file__).resolve().parent


def build() -> tf.keras.Model:
    frame = tf.keras.Input((16, 16, 3), batch_size=1, name="frame")
    a = tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv_a")(frame)
    b = tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv_b")(a)
    c = tf.keras.layers.Add(name="skip")([a, b])
    d = tf.keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu", name="conv_c")(c)
    e = tf.keras.layers.GlobalAveragePooling2D(name="pool")(d)
    feature = tf.keras.layers.Dense(8, name="feature")(e)
    return tf.keras.Model(frame, feature)


def main() -> None:
    tf.keras.utils.set_random_seed(0)
    model = build()
    rng = np.random.default_rng(0)

    def representative():
        for _ in range(32):
            yield [rng.uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32)]

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    (HERE / "tiny_encoder.tflite").write_bytes(conv.convert())


if __name__ == "__main__":
    main()
