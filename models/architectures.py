"""Keras definitions: the MobileNet-style frame CNN, the S2VT-style LSTM captioner and its step models.

The captioner is built from named layers (``enc_lstm``, ``embed``, ``dec_lstm``,
``logits``) so that the step models in ``StepModels`` reuse exactly the trained
weights, one frame or one word at a time with explicit (h, c) state, as
docs/bundle.md specifies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import keras
import tensorflow as tf
from keras import layers


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the captioning model.

    Attributes:
      input_size: Side of the square frame the CNN takes.
      feature_size: F, the CNN's output vector.
      width: Multiplier on the CNN's channel counts.
      hidden_size: H, the LSTM state size of both encoder and decoder.
      embed_size: Word embedding size.
      window_frames: Frames per caption window.
      max_caption_length: Most words in a caption, without bos/eos.
    """

    input_size: int = 64
    feature_size: int = 128
    width: float = 1.0
    hidden_size: int = 128
    embed_size: int = 64
    window_frames: int = 8
    max_caption_length: int = 8


# (expansion, output channels, stride, repeats) of the inverted-bottleneck stages,
# as in MobileNetV2; the last stages stay at 4x4 so most parameters sit where
# compute is cheap.
_STAGES = ((1, 16, 1, 1), (4, 24, 2, 2), (4, 40, 2, 2), (6, 80, 2, 3), (6, 96, 1, 1))
_HEAD_CHANNELS = 192


def _channels(c: int, width: float) -> int:
    return max(8, int(round(c * width / 8)) * 8)


def _conv_bn(x: tf.Tensor, filters: int, kernel: int, stride: int, name: str, act: bool = True):
    x = layers.Conv2D(filters, kernel, stride, padding="same", use_bias=False, name=f"{name}_conv")(x)
    x = layers.BatchNormalization(name=f"{name}_bn")(x)
    return layers.ReLU(6.0, name=f"{name}_relu")(x) if act else x


def _inverted_bottleneck(x: tf.Tensor, expansion: int, out: int, stride: int, name: str):
    inp = x
    c_in = x.shape[-1]
    if expansion != 1:
        x = _conv_bn(x, c_in * expansion, 1, 1, f"{name}_expand")
    x = layers.DepthwiseConv2D(3, stride, padding="same", use_bias=False, name=f"{name}_dw")(x)
    x = layers.BatchNormalization(name=f"{name}_dw_bn")(x)
    x = layers.ReLU(6.0, name=f"{name}_dw_relu")(x)
    x = _conv_bn(x, out, 1, 1, f"{name}_project", act=False)
    if stride == 1 and c_in == out:
        x = layers.Add(name=f"{name}_add")([inp, x])
    return x


def build_frame_encoder(config: ModelConfig) -> keras.Model:
    """Builds the frame CNN: normalised RGB ``[B,S,S,3]`` in, feature ``[B,F]`` out.

    MobileNetV2-style residual inverted bottlenecks down to a 4x4 map, which is
    flattened rather than pooled so the feature keeps where the object is.
    """
    s = config.input_size
    frame = keras.Input((s, s, 3), name="frame")
    x = _conv_bn(frame, _channels(16, config.width), 3, 2, "stem")
    block = 0
    for expansion, out, stride, repeats in _STAGES:
        for r in range(repeats):
            x = _inverted_bottleneck(
                x, expansion, _channels(out, config.width), stride if r == 0 else 1, f"block_{block}"
            )
            block += 1
    x = _conv_bn(x, _channels(_HEAD_CHANNELS, config.width), 1, 1, "head")
    x = layers.Flatten(name="flatten")(x)
    feature = layers.Dense(config.feature_size, name="feature")(x)
    return keras.Model(frame, feature, name="frame_encoder")


def build_rnn(config: ModelConfig, vocab_size: int) -> keras.Model:
    """Builds the S2VT-style RNN for teacher forcing.

    Inputs are ``features [B,N,F]`` and ``words [B,L]`` (bos then the caption);
    the output is next-word logits ``[B,L,V]``. The encoder LSTM's last state is
    the decoder LSTM's first.
    """
    features = keras.Input((config.window_frames, config.feature_size), name="features")
    words = keras.Input((config.max_caption_length + 1,), dtype="int32", name="words")
    _, h, c = layers.LSTM(config.hidden_size, return_state=True, name="enc_lstm")(features)
    x = layers.Embedding(vocab_size, config.embed_size, name="embed")(words)
    x = layers.LSTM(config.hidden_size, return_sequences=True, name="dec_lstm")(x, initial_state=[h, c])
    logits = layers.Dense(vocab_size, name="logits")(x)
    return keras.Model([features, words], logits, name="rnn")


def build_captioner(
    cnn: keras.Model, rnn: keras.Model, config: ModelConfig, vocab_size: int
) -> keras.Model:
    """Joins CNN and RNN for end-to-end training on uint8 RGB windows.

    Inputs are ``frames [B,N,S,S,3] uint8`` and ``words``; outputs are the caption
    logits and two per-frame auxiliary heads on the CNN features: bag-of-words
    logits ``[B,N,V]``, which teach the CNN what is in a frame before the LSTMs
    can pass it gradient, and ``orientation [B,N,2]``, the outline's angle as a
    point on the circle of its symmetry period. The caption loss alone never
    made the features carry that angle, so the encoder LSTM could not tell a
    clockwise turn from a counterclockwise one.
    """
    s = config.input_size
    frames = keras.Input((config.window_frames, s, s, 3), dtype="uint8", name="frames")
    words = keras.Input((config.max_caption_length + 1,), dtype="int32", name="words")
    x = layers.Rescaling(1 / 127.5, offset=-1.0, name="normalise")(frames)
    features = layers.TimeDistributed(cnn, name="per_frame_cnn")(x)
    caption = rnn([features, words])
    bag = layers.Dense(vocab_size, name="bag_of_words")(features)
    orientation = layers.Dense(2, name="orientation")(features)
    return keras.Model([frames, words], {"caption": caption, "bag": bag,
                                         "orientation": orientation}, name="captioner")


class StepModels:
    """The RNN as one-step functions with explicit state, sharing the trained layers.

    ``encoder_step(feature, h, c)`` advances the encoder LSTM by one frame;
    ``decoder_step(word, h, c)`` feeds one word to the decoder LSTM and returns
    next-word logits. Both return dicts named as docs/bundle.md specifies.
    """

    def __init__(self, rnn: keras.Model):
        self._enc = rnn.get_layer("enc_lstm").cell
        self._dec = rnn.get_layer("dec_lstm").cell
        self._embed = rnn.get_layer("embed")
        self._logits = rnn.get_layer("logits")

    def encoder_step(self, feature: tf.Tensor, h: tf.Tensor, c: tf.Tensor) -> Dict[str, tf.Tensor]:
        """Advances the encoder by one frame feature ``[1,F]``; returns ``h_out``, ``c_out``."""
        _, (h_out, c_out) = self._enc(feature, [h, c])
        return {"h_out": h_out, "c_out": c_out}

    def decoder_step(self, word: tf.Tensor, h: tf.Tensor, c: tf.Tensor) -> Dict[str, tf.Tensor]:
        """Feeds word ids ``[1]``; returns next-word ``logits``, ``h_out``, ``c_out``."""
        _, (h_out, c_out) = self._dec(self._embed(word), [h, c])
        return {"logits": self._logits(h_out), "h_out": h_out, "c_out": c_out}


def greedy_decode(rnn: keras.Model, features: tf.Tensor, bos: int, steps: int) -> tf.Tensor:
    """Greedily decodes a batch of windows with the trained layers, in the step models' order.

    Args:
      rnn: The model from ``build_rnn``.
      features: ``[B,N,F]`` frame features.
      bos: Begin-of-sentence token id.
      steps: Words to generate.

    Returns:
      Tokens ``[B,steps] int32``.
    """
    _, h, c = rnn.get_layer("enc_lstm")(features)
    dec, embed, head = rnn.get_layer("dec_lstm").cell, rnn.get_layer("embed"), rnn.get_layer("logits")
    word = tf.fill([tf.shape(features)[0]], bos)
    tokens = []
    for _ in range(steps):
        out, (h, c) = dec(embed(word), [h, c])
        word = tf.cast(tf.argmax(head(out), -1), tf.int32)
        tokens.append(word)
    return tf.stack(tokens, 1)
