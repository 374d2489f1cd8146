"""models.train_frozen: the S2VT RNN trained on a fixed encoder's cached features, from a real corpus format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corpus_fixtures import write_msrvtt, write_msvd
from models import train_frozen

DEMO_ENCODER = Path(__file__).resolve().parents[1] / "models" / "demo" / "bundle" / "encoder.tflite"
CSV = "MSR Video Description Corpus.csv"


@pytest.mark.parametrize("make, argv, message", [
    (lambda d: write_msvd(d, 1), ["--msvd", "{d}/" + CSV], "need --videos"),
    (lambda d: None, ["--data", "{d}", "--encoder", "{d}/none.tflite"], "none.tflite: no such file"),
    (lambda d: (d / "x.csv").write_text("a,b\n"), ["--msvd", "{d}/x.csv", "--videos", "{d}"],
     "is not MSVD's"),
    (lambda d: write_msrvtt(d, splits=("test",)),
     ["--msrvtt", "{d}/train_val_videodatainfo.json", "--videos", "{d}/TrainValVideo"],
     "no clip in the 'train' split"),
])
def test_bad_input_is_one_line_and_exit_2_before_tensorflow_loads(tmp_path, capsys, make, argv, message):
    make(tmp_path)
    args = [a.format(d=tmp_path) for a in argv]
    if "--encoder" not in args:
        args += ["--encoder", str(DEMO_ENCODER)]
    assert train_frozen.main(args + ["--cache", str(tmp_path / "cache"),
                                     "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err
    assert not (tmp_path / "b").exists()


def test_frequent_vocab_keeps_specials_and_words_seen_often_enough():
    vocab = train_frozen.frequent_vocab(["a cat runs", "a dog runs", "a cat sits"], min_count=2)
    assert vocab == ["<pad>", "<bos>", "<eos>", "<unk>", "a", "cat", "runs"]


@pytest.mark.tf
@pytest.mark.slow
def test_one_command_trains_a_bundle_from_msrvtt_that_validates_captions_and_reuses_features(tmp_path):
    pytest.importorskip("tensorflow")
    from edgecap.bundle import load_bundle
    from edgecap.captioner import EdgeCaptioner
    from models.feature_cache import Window, first_window

    write_msrvtt(tmp_path / "c")
    argv = ["--encoder", str(DEMO_ENCODER), "--msrvtt", str(tmp_path / "c" / "train_val_videodatainfo.json"),
            "--videos", str(tmp_path / "c" / "TrainValVideo"), "--cache", str(tmp_path / "cache"),
            "--out", str(tmp_path / "b"), "--epochs", "2", "--hidden-size", "16", "--threads", "1"]
    first = train_frozen.train(train_frozen.parse_args(argv))
    assert (first["features_computed"], first["features_reused"]) == (3, 0)
    assert first["test_clips"] == 2 and 0.0 <= first["exact_match_tflite"] <= 1.0

    bundle = load_bundle(tmp_path / "b")  # validates every file against bundle.json
    meta = json.loads((tmp_path / "b" / "bundle.json").read_text())
    assert (tmp_path / "b" / meta["encoder"]).read_bytes() == DEMO_ENCODER.read_bytes()
    assert meta["provenance"]["heldout"]["test_clips"] == 2 and bundle.feature_size == 128
    with EdgeCaptioner(tmp_path / "b", pipelined=False, num_threads=1) as cap:
        frames = first_window(tmp_path / "c" / "TrainValVideo" / "video4.mp4", Window())
        assert cap.caption_frames(frames)[0].text.strip()

    again = train_frozen.train(train_frozen.parse_args(argv + ["--out", str(tmp_path / "b2")]))
    assert (again["features_computed"], again["features_reused"]) == (0, 3)
