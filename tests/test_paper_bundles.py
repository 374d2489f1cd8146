"""Paper-scale bundles: the weights field, its marking on captions, the recipe's table and exports."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from edgecap.bundle import load_bundle
from edgecap.errors import BundleError
from models import paper_bundles
from models.bundle_meta import CAFFE_NORM, TF_NORM, WEIGHTS, weights_note
from models.paper_specs import EDGETPU_SRAM, PAPER_BACKBONES, default_cache, inspect_built


def _with_weights(src: Path, dst: Path, weights: object) -> Path:
    shutil.copytree(src, dst)
    meta = json.loads((dst / "bundle.json").read_text())
    meta["weights"] = weights
    (dst / "bundle.json").write_text(json.dumps(meta))
    return dst


def test_weights_default_to_trained_and_are_read(shipped_bundle: Path, tmp_path: Path) -> None:
    assert "weights" not in json.loads((shipped_bundle / "bundle.json").read_text())
    assert load_bundle(shipped_bundle).weights == "trained"
    assert load_bundle(_with_weights(shipped_bundle, tmp_path / "b", "random")).weights == "random"


def test_unknown_weights_value_is_refused_naming_the_field(shipped_bundle: Path, tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="weights"):
        load_bundle(_with_weights(shipped_bundle, tmp_path / "b", "pretrained"))


def test_caption_marks_random_weights(shipped_bundle: Path, tmp_path: Path, capsys) -> None:
    from conftest import write_noise_clip
    from edgecap.cli import main

    clip = write_noise_clip(tmp_path / "clip.mp4", 16, 64)
    bundle = _with_weights(shipped_bundle, tmp_path / "b", "random")
    assert main(["caption", str(clip), "--bundle", str(bundle), "--json"]) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows and all(r["weights"] == "random" for r in rows)
    assert "BUNDLE: random weights" in err

    assert main(["caption", str(clip), "--bundle", str(shipped_bundle), "--json"]) == 0
    out, err = capsys.readouterr()
    assert all(json.loads(line)["weights"] == "trained" for line in out.splitlines())
    assert "BUNDLE:" not in err


def test_weights_notes_say_which_captions_mean_nothing() -> None:
    assert "not quality" not in weights_note("trained")
    assert all("not quality" in weights_note(w) for w in WEIGHTS if w != "trained")
    with pytest.raises(ValueError, match="pretrained"):
        weights_note("pretrained")


def test_paper_backbones_are_native_sizes_and_conventions() -> None:
    sizes = {spec.constructor: (spec.size, spec.norm) for spec in PAPER_BACKBONES.values()}
    assert sizes == {"ResNet50": (224, CAFFE_NORM), "InceptionV3": (299, TF_NORM),
                     "MobileNetV2": (224, TF_NORM)}
    assert CAFFE_NORM.as_input(224)["color_order"] == "BGR"
    assert TF_NORM.as_input(299) == {"height": 299, "width": 299, "channels": 3, "color_order": "RGB",
                                     "mean": [127.5] * 3, "std": [127.5] * 3}


def test_default_cache_follows_edgecap_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGECAP_CACHE", str(tmp_path))
    assert default_cache() == tmp_path / "bundles"


def test_inspect_built_counts_the_demo_encoder_params(shipped_bundle: Path) -> None:
    built = inspect_built(shipped_bundle)
    encoder_file = (shipped_bundle / "encoder.tflite").stat().st_size
    # The demo fits one EdgeTPU: the gap the paper-scale bundles exist to close.
    assert 0.5 * encoder_file < built.encoder_param_bytes < min(encoder_file, EDGETPU_SRAM)
    assert (built.hidden_size, built.feature_size, built.weights) == (128, 128, "trained")


@pytest.fixture
def no_build(monkeypatch):
    """Fails the test if the recipe gets as far as building a model (TensorFlow)."""
    def build(*args, **kwargs):
        pytest.fail(f"the build started before the arguments were refused: {args}")
    monkeypatch.setattr(paper_bundles, "build", build)


@pytest.mark.parametrize("args, message", [
    (["--hidden", "0"], "--hidden 0: the RNN needs at least 1 unit"),
    (["--calibration-frames", "1"], "--calibration-frames 1: give at least 2"),
    (["--seed", "-1"], "--seed -1: give a seed from 0"),
    (["--into", "{tmp}/file"], "is a file, not a folder"),
    (["--into", "{tmp}/missing/bundles"], "no directory"),
])
def test_paper_bundles_refuse_bad_arguments_before_building(
        no_build, tmp_path: Path, capsys, args, message) -> None:
    (tmp_path / "file").write_text("x")
    argv = [a.format(tmp=tmp_path) for a in args]
    if "--into" not in argv:
        argv += ["--into", str(tmp_path / "cache")]
    assert paper_bundles._main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m models.paper_bundles: error: ")
    assert message in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing created


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only directory")
def test_paper_bundles_refuse_a_read_only_cache(no_build, tmp_path: Path, capsys) -> None:
    (tmp_path / "ro").mkdir(mode=0o555)
    assert paper_bundles._main(["--into", str(tmp_path / "ro" / "bundles")]) == 2
    assert "cannot write in" in capsys.readouterr().err


def test_paper_bundles_build_into_the_checked_cache(monkeypatch, tmp_path: Path) -> None:
    calls = []
    monkeypatch.setattr(paper_bundles, "build", lambda *a: calls.append(a) or a[1] / a[0])
    monkeypatch.setattr(paper_bundles, "describe", lambda path: "described")
    monkeypatch.setenv("EDGECAP_CACHE", str(tmp_path / "fresh" / "edgecap"))
    # The default cache's parents are edgecap's own and are made; the bundles folder is build's.
    assert paper_bundles._main(["--only", "mobilenetv2-224", "--calibration-frames", "2"]) == 0
    assert calls == [("mobilenetv2-224", tmp_path / "fresh" / "edgecap" / "bundles", 512, 2, 0)]
    assert (tmp_path / "fresh" / "edgecap").is_dir()


@pytest.mark.parametrize("failure, message", [
    (BundleError("resnet50-224: the int8 encoder gives one feature vector"), "one feature vector"),
    (ModuleNotFoundError("no keras", name="keras"), "keras is not installed: pip install -e .[train]"),
    (OSError(28, "No space left on device"), "No space left on device"),
])
def test_paper_bundles_known_build_failures_are_one_line_exit_2(
        monkeypatch, tmp_path: Path, capsys, failure, message) -> None:
    def build(*args):
        raise failure
    monkeypatch.setattr(paper_bundles, "build", build)
    assert paper_bundles._main(["--into", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.tf
def test_staged_bundle_replaces_the_old_whole_or_not_at_all(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    from models import backbones

    final = tmp_path / "b"
    with backbones.staged_dir(final) as tmp:
        (tmp / "bundle.json").write_text("old")
    with pytest.raises(OSError):
        with backbones.staged_dir(final) as tmp:
            (tmp / "bundle.json").write_text("half")
            raise OSError(28, "No space left on device")
    assert [p.name for p in tmp_path.iterdir()] == ["b"] and (final / "bundle.json").read_text() == "old"
    with backbones.staged_dir(final) as tmp:
        (tmp / "encoder.tflite").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["b"]
    assert sorted(p.name for p in final.iterdir()) == ["encoder.tflite"]


@pytest.mark.tf
def test_backbone_out_is_checked_before_the_model_is_loaded(tmp_path: Path, capsys) -> None:
    pytest.importorskip("tensorflow")
    from models import backbones

    (tmp_path / "cnn.keras").write_text("not loaded: the check comes first")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    for out, message in ((tmp_path / "missing" / "b", "no directory"),
                         (tmp_path / "cnn.keras", "is a file, not a folder"),
                         (tmp_path / "notes", "not a bundle and is not empty")):
        assert backbones._main(["--keras", str(tmp_path / "cnn.keras"), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.keras", "notes"]


@pytest.mark.tf
def test_any_keras_backbone_becomes_a_bundle(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    import keras

    from edgecap.captioner import EdgeCaptioner
    from models import backbones

    keras.utils.set_random_seed(0)
    frame = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(8, 3, 2, activation="relu")(frame)
    x = keras.layers.Conv2D(24, 3, 2)(x)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))  # a map: pooled by the wrapper
    source = backbones.pooled_encoder(keras.Model(frame, x), TF_NORM)
    assert source.feature_size == 24 and source.input_size == 32
    vocab = backbones.demo_vocab()
    rnn = backbones.random_rnn(source.feature_size, 16, len(vocab))
    frames = backbones.calibration_frames(source, 4)
    assert frames.shape == (4, 32, 32, 3) and -1.0 <= frames.min() and frames.max() <= 1.0
    assert backbones.fit_batchnorm(source, frames) == 1
    features = keras.ops.convert_to_numpy(source.model(frames, training=False))
    assert 0.2 < features.std() / features.mean() and features.mean() > 0.1  # unit scale, varied
    backbones.build_bundle(tmp_path / "b", "tiny", source, rnn, vocab, "random", frames, {"test": 1})

    bundle = load_bundle(tmp_path / "b")
    assert (bundle.weights, bundle.feature_size, bundle.hidden_size) == ("random", 24, 16)
    assert bundle.reference_encoder is None
    with EdgeCaptioner(bundle) as cap:
        captions = list(cap.stream(str(backbones.DEMO / "sample.mp4")))
    assert captions and all(c.text for c in captions)


@pytest.mark.tf
def test_saved_backbone_and_rnn_become_a_trained_bundle_from_the_command_line(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    import keras

    from models import backbones

    frame = keras.Input((32, 32, 3))
    keras.Model(frame, keras.layers.GlobalAveragePooling2D()(
        keras.layers.Conv2D(12, 3, 2, activation="relu")(frame))).save(tmp_path / "cnn.keras")
    vocab = backbones.demo_vocab()
    backbones.random_rnn(12, 8, len(vocab)).save(tmp_path / "rnn.keras")
    assert backbones._main(["--keras", str(tmp_path / "cnn.keras"), "--rnn", str(tmp_path / "rnn.keras"),
                            "--out", str(tmp_path / "mine"), "--calibration-frames", "3",
                            "--color-order", "BGR", "--mean", "0", "0", "0", "--std", "255", "255", "255"]) == 0
    bundle = load_bundle(tmp_path / "mine")
    assert (bundle.weights, bundle.feature_size, bundle.hidden_size) == ("trained", 12, 8)
    assert bundle.input.color_order == "BGR" and bundle.input.std == (255.0,) * 3


@pytest.mark.tf
def test_an_rnn_that_does_not_fit_the_backbone_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    pytest.importorskip("tensorflow")
    import keras

    from models import backbones

    frame = keras.Input((16, 16, 3))
    keras.Model(frame, keras.layers.Conv2D(6, 3)(frame)).save(tmp_path / "cnn.keras")
    backbones.random_rnn(7, 8, len(backbones.demo_vocab())).save(tmp_path / "rnn.keras")
    code = backbones._main(["--keras", str(tmp_path / "cnn.keras"), "--rnn", str(tmp_path / "rnn.keras"),
                            "--out", str(tmp_path / "mine")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "takes 7 features but the encoder gives 6" in err[0]
    assert not (tmp_path / "mine").exists()
    assert backbones._main(["--keras", str(tmp_path / "none.keras"), "--out", str(tmp_path / "x")]) == 2
    assert "none.keras: no such file (--keras)" in capsys.readouterr().err


@pytest.mark.tf
def test_backbone_without_a_square_input_is_refused() -> None:
    pytest.importorskip("tensorflow")
    import keras

    from models import backbones

    frame = keras.Input((32, 48, 3))
    with pytest.raises(ValueError, match="square"):
        backbones.pooled_encoder(keras.Model(frame, keras.layers.Conv2D(4, 3)(frame)), TF_NORM)


@pytest.mark.tf
@pytest.mark.slow
def test_resnet50_bundle_overflows_one_edgetpu(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    from models import paper_bundles

    path = paper_bundles.build("resnet50-224", tmp_path, 512, 2, 0)
    built = inspect_built(path)
    assert built.encoder_param_bytes > EDGETPU_SRAM
    assert (built.feature_size, built.hidden_size, built.weights) == (2048, 512, "random")
    assert load_bundle(path).input.color_order == "BGR"
