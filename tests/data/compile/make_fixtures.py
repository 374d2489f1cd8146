"""Generates the small int8 models the compiler tests use (needs TensorFlow; run once).

    python tests/data/compile/make_fixtures.py

Each is a miniature of an architecture family the partitioner must cut: residual
adds (MobileNetV2), parallel branches joined by a concat (Inception), and a
chain of growing concats (DenseNet). Random weights, 32x32x3 frames, full int8.
"""

from __future__ import annotations

from pathlib import Path

import keras
from keras import layers

from edgecap_compile.int8_export import export_int8

HERE = Path(__file__).parent
SHAPE = (32, 32, 3)


def _bn_relu(x):
    return layers.ReLU(6.0)(layers.BatchNormalization()(x))


def mobilenet_like() -> keras.Model:
    inputs = keras.Input(SHAPE)
    x = _bn_relu(layers.Conv2D(16, 3, strides=2, padding="same")(inputs))
    for filters, stride in ((16, 1), (24, 2), (24, 1), (32, 2), (32, 1)):
        y = _bn_relu(layers.Conv2D(filters * 4, 1)(x))
        y = _bn_relu(layers.DepthwiseConv2D(3, strides=stride, padding="same")(y))
        y = layers.BatchNormalization()(layers.Conv2D(filters, 1)(y))
        x = layers.Add()([x, y]) if stride == 1 and x.shape[-1] == filters else y
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(64)(x), name="tiny_mobilenet")


def inception_like() -> keras.Model:
    inputs = keras.Input(SHAPE)
    x = _bn_relu(layers.Conv2D(24, 3, strides=2, padding="same")(inputs))
    for width in (16, 24):
        a = _bn_relu(layers.Conv2D(width, 1)(x))
        b = _bn_relu(layers.Conv2D(width, 3, padding="same")(_bn_relu(layers.Conv2D(width, 1)(x))))
        c = _bn_relu(layers.Conv2D(width, 5, padding="same")(_bn_relu(layers.Conv2D(8, 1)(x))))
        d = _bn_relu(layers.Conv2D(width, 1)(layers.AveragePooling2D(3, 1, "same")(x)))
        x = layers.Concatenate()([a, b, c, d])
        x = layers.MaxPooling2D(2)(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(64)(x), name="tiny_inception")


def densenet_like() -> keras.Model:
    inputs = keras.Input(SHAPE)
    x = _bn_relu(layers.Conv2D(16, 3, strides=2, padding="same")(inputs))
    for block in range(2):
        for _ in range(4):
            y = _bn_relu(layers.Conv2D(16, 3, padding="same")(_bn_relu(layers.Conv2D(32, 1)(x))))
            x = layers.Concatenate()([x, y])
        if block == 0:
            x = layers.AveragePooling2D(2)(_bn_relu(layers.Conv2D(32, 1)(x)))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(64)(x), name="tiny_densenet")


def float_model() -> bytes:
    """A float32 TFLite model: the compiler must refuse it."""
    import tensorflow as tf

    model = keras.Sequential([keras.Input(SHAPE, batch_size=1), layers.Conv2D(4, 3),
                              layers.GlobalAveragePooling2D()])
    return tf.lite.TFLiteConverter.from_keras_model(model).convert()


if __name__ == "__main__":
    keras.utils.set_random_seed(0)
    for build in (mobilenet_like, inception_like, densenet_like):
        model = build()
        path = HERE / f"{model.name}.tflite"
        path.write_bytes(export_int8(model, SHAPE, samples=8))
        print(path, path.stat().st_size)
    (HERE / "tiny_float.tflite").write_bytes(float_model())
