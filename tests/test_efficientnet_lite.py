"""models.efficientnet_lite: PyTorch-layout weights land in the Keras EfficientNet-Lite0 as PyTorch means them.

A random state dict in efficientnet_pytorch's names and layouts is loaded;
the stem and a depthwise convolution are then checked against PyTorch's
definition of a convolution (``out[o,y,x] = sum w[o,i,ky,kx] in[i,sy+ky,sx+kx]``)
written in numpy, and the classifier against ``x @ W.T + b``. Needs TensorFlow.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.tf


def _random_state(model, rng):
    """A state dict in PyTorch's layouts for every weighted layer of the Keras model."""
    import keras
    from keras import layers

    state = {}
    for layer in model.layers:
        name = "_" + layer.name  # PyTorch's module name
        if isinstance(layer, layers.DepthwiseConv2D):
            kh, kw, c, _ = layer.kernel.shape
            state[name + ".weight"] = rng.normal(0, 0.3, (c, 1, kh, kw)).astype(np.float32)
        elif isinstance(layer, layers.Conv2D):
            kh, kw, i, o = layer.kernel.shape
            state[name + ".weight"] = rng.normal(0, 0.3, (o, i, kh, kw)).astype(np.float32)
        elif isinstance(layer, layers.BatchNormalization):
            c = layer.gamma.shape[0]
            state[name + ".weight"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
            state[name + ".bias"] = rng.normal(0, 0.1, c).astype(np.float32)
            state[name + ".running_mean"] = rng.normal(0, 0.1, c).astype(np.float32)
            state[name + ".running_var"] = rng.uniform(0.5, 2, c).astype(np.float32)
            state[name + ".num_batches_tracked"] = np.array(5, np.int64)
        elif isinstance(layer, keras.layers.Dense):
            i, o = layer.kernel.shape
            state[name + ".weight"] = rng.normal(0, 0.05, (o, i)).astype(np.float32)
            state[name + ".bias"] = rng.normal(0, 0.1, o).astype(np.float32)
    return state


def test_pytorch_weights_give_pytorch_convolutions_and_the_full_lite0_parameter_count():
    pytest.importorskip("tensorflow")
    import keras

    from models import efficientnet_lite as E

    model = E.build(include_top=True)
    rng = np.random.default_rng(0)
    state = _random_state(model, rng)
    count = E.load_state(model, state)
    # Weights and batch-norm statistics: the package's file holds 4,694,073 values,
    # these plus one batch counter for each of the 49 batch norms.
    assert count == sum(v.size for k, v in state.items() if not k.endswith("num_batches_tracked"))
    assert model.count_params() == count == 4_694_024

    x = rng.normal(0, 1, (1, 224, 224, 3)).astype(np.float32)
    stem = keras.Model(model.inputs, model.get_layer("conv_stem").output)(x).numpy()[0]
    w = state["_conv_stem.weight"]  # [out, in, kh, kw]
    for y, xx in ((0, 0), (5, 9), (110, 57)):
        # TF "same" at stride 2 on an even side pads only after: no offset before.
        patch = x[0, 2 * y:2 * y + 3, 2 * xx:2 * xx + 3, :]  # [ky, kx, in]
        want = np.einsum("oikl,kli->o", w, patch)
        np.testing.assert_allclose(stem[y, xx], want, rtol=1e-4, atol=1e-4)

    dw_layer = model.get_layer("blocks.0._depthwise_conv")
    feed = keras.Model(model.inputs, dw_layer.input)(x).numpy()[0]
    dw = keras.Model(model.inputs, dw_layer.output)(x).numpy()[0]
    wd = state["_blocks.0._depthwise_conv.weight"]  # [C, 1, kh, kw]
    for y, xx in ((3, 4), (60, 61)):
        patch = feed[y - 1:y + 2, xx - 1:xx + 2, :]
        np.testing.assert_allclose(dw[y, xx], np.einsum("ckl,klc->c", wd[:, 0], patch),
                                   rtol=1e-4, atol=1e-4)

    pooled = keras.Model(model.inputs, model.get_layer("pool").output)(x).numpy()
    logits = model(x).numpy()
    np.testing.assert_allclose(logits, pooled @ state["_fc.weight"].T + state["_fc.bias"],
                               rtol=1e-4, atol=1e-4)


def test_every_variable_has_a_name_tensorflow_export_accepts():
    pytest.importorskip("tensorflow")
    import re

    from models import efficientnet_lite as E

    # TensorFlow's root scope pattern: a leading "_" (PyTorch's "_conv_stem") fails the int8 export.
    scope = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*$")
    assert all(scope.match(w.path) for w in E.build(include_top=True).weights)


def test_a_state_dict_of_another_network_is_refused_naming_the_missing_parameter():
    pytest.importorskip("tensorflow")
    from models import efficientnet_lite as E

    with pytest.raises(ValueError, match="no _conv_stem.weight"):
        E.load_state(E.build(include_top=False), {"conv1.weight": np.zeros((64, 3, 7, 7), np.float32)})
