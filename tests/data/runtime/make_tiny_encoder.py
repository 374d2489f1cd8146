"""Writes tiny_encoder.tflite: a full-integer CNN with a skip connection, for runtime tests.

Run with TensorFlow (the train extra): /work/venv-train/bin/python tests/data/runtime/make_tiny_encoder.py
The skip connection makes a tensor pass through a middle stage when the model is split.
"""

from pathlib import Path

import tensorflow as tf

from edgecap_compile.int8_export import export_int8

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
    (HERE / "tiny_encoder.tflite").write_bytes(export_int8(build(), (16, 16, 3), samples=32))


if __name__ == "__main__":
    main()
