"""The real-world bundle's step models (models/coco_bundle.py): the encoder step reads the class map and
summarises it as the recipe trained on; needs TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.tf


def test_exported_encoder_step_equals_the_trained_lstm_on_the_numpy_summary(tmp_path):
    pytest.importorskip("tensorflow")
    import keras

    from edgecap.rnn import RnnEncoder, State
    from models import coco_bundle, nanodet, scene_summary
    from models.architectures import ModelConfig

    keras.utils.set_random_seed(0)
    config = ModelConfig(input_size=nanodet.SIZE, feature_size=scene_summary.SUMMARY_SIZE, hidden_size=8,
                         window_frames=coco_bundle.FRAMES, max_caption_length=coco_bundle.MAX_LEN)
    vocab = coco_bundle.vocabulary()
    rnn = coco_bundle.build_rnn(config, len(vocab))
    steps = coco_bundle.export_steps(rnn, config, 0.4)
    (tmp_path / "enc.tflite").write_bytes(steps["encoder_step"])

    rng = np.random.default_rng(1)
    maps = (rng.random((coco_bundle.FRAMES, nanodet.HEAT_SIZE)) ** 8).astype(np.float32)
    state = State.zeros(8)
    step = RnnEncoder(tmp_path / "enc.tflite")
    for m in maps:
        state = step.step(m, state)
    summaries = np.stack([scene_summary.summarise(m, 0.4) for m in maps])[None]
    _, h, c = rnn.get_layer("enc_lstm")(summaries)
    assert np.allclose(state.h, np.asarray(h), atol=1e-4) and np.allclose(state.c, np.asarray(c), atol=1e-4)
    assert set(steps) == {"encoder_step", "decoder_step", "encoder_step_int8", "decoder_step_int8"}
