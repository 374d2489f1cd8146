"""MSVD and MSR-VTT readers (models.video_datasets) and the feature cache (models.feature_cache).

No TensorFlow: the corpora are tiny fixtures in the real formats
(tests/corpus_fixtures.py) and the encoder is the demo bundle's.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from corpus_fixtures import write_msrvtt, write_msvd
from edgecap.errors import ConfigError
from models.bundle_meta import TF_NORM
from models.feature_cache import FeatureCache, TfliteFrameEncoder, Window, first_window
from models.video_datasets import msvd_split, read_msrvtt, read_msvd

DEMO_ENCODER = Path(__file__).resolve().parents[1] / "models" / "demo" / "bundle" / "encoder.tflite"
CSV = "MSR Video Description Corpus.csv"


def test_msvd_csv_gives_english_descriptions_per_clip_and_its_usual_split(tmp_path):
    want = write_msvd(tmp_path, clips=6)
    data = read_msvd(tmp_path / CSV, tmp_path / "YouTubeClips")
    assert data.captions == want
    # 3 English descriptions per clip: German and empty ones are left out; quoted commas kept.
    assert all(len(refs) == 3 and refs[2].endswith(", slowly") for refs in data.captions.values())
    assert sum(map(len, data.splits.values())) == 6 and data.splits["train"]
    assert data.splits == msvd_split(list(want))
    assert data.clip_path("mv89psg6z03_9_10") == tmp_path / "YouTubeClips" / "mv89psg6z03_9_10.avi"
    assert read_msvd(tmp_path / CSV, tmp_path / "YouTubeClips", "German").captions[
        "mv89psg6z00_0_1"] == ["eine Form bewegt sich"]


def test_the_full_msvd_gets_1200_100_670_and_a_subset_the_same_proportions():
    full = msvd_split([str(i) for i in range(1970)])
    assert [len(full[s]) for s in ("train", "val", "test")] == [1200, 100, 670]
    assert full["train"][0] == "0" and full["test"][-1] == "1969"
    small = msvd_split([str(i) for i in range(197)])
    assert [len(small[s]) for s in ("train", "val", "test")] == [120, 10, 67]


def test_msrvtt_json_gives_captions_in_sen_id_order_and_its_splits(tmp_path):
    want = write_msrvtt(tmp_path)
    data = read_msrvtt(tmp_path / "train_val_videodatainfo.json", tmp_path / "TrainValVideo")
    assert data.captions == want
    assert data.splits == {"train": ["video0", "video1", "video2"], "val": ["video3"],
                           "test": ["video4", "video5"]}
    assert data.clip_path("video4").name == "video4.mp4"


@pytest.mark.parametrize("content, match", [
    ("VideoID,Start,End\nabc,1,2\n", "is not MSVD's"),
    ("VideoID,Start,End,WorkerID,Source,AnnotationTime,Language,Description\nabc,1,2,3\n",
     "line 2 has 4 fields"),
    ("VideoID,Start,End,WorkerID,Source,AnnotationTime,Language,Description\n"
     "abc,1,2,3,clean,4,German,hallo\n", "no description in English"),
])
def test_a_malformed_msvd_csv_is_one_line_naming_the_file_and_the_fix(tmp_path, content, match):
    (tmp_path / "clips").mkdir()
    (tmp_path / "bad.csv").write_text(content)
    with pytest.raises(ConfigError, match=match) as e:
        read_msvd(tmp_path / "bad.csv", tmp_path / "clips")
    assert "\n" not in str(e.value) and "bad.csv" in str(e.value)


@pytest.mark.parametrize("doc, match", [
    ("{", "not valid JSON"),
    ('{"videos": []}', "no 'videos' and 'sentences' lists"),
    ('{"videos": [{"video_id": "v0", "split": "dev"}], "sentences": []}', "split 'dev'"),
    ('{"videos": [{"video_id": "v0", "split": "train"}], '
     '"sentences": [{"video_id": "v9", "caption": "x", "sen_id": 0}]}', r"sentences\[0\]"),
])
def test_a_malformed_msrvtt_json_is_one_line_naming_the_file_and_the_fix(tmp_path, doc, match):
    (tmp_path / "clips").mkdir()
    (tmp_path / "info.json").write_text(doc)
    with pytest.raises(ConfigError, match=match) as e:
        read_msrvtt(tmp_path / "info.json", tmp_path / "clips")
    assert "\n" not in str(e.value) and "info.json" in str(e.value)


def test_a_missing_index_video_folder_or_clip_is_one_line_with_the_fix(tmp_path):
    write_msvd(tmp_path, clips=1)
    with pytest.raises(ConfigError, match="no such folder"):
        read_msvd(tmp_path / CSV, tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="no such file"):
        read_msvd(tmp_path / "absent.csv", tmp_path / "YouTubeClips")
    data = read_msvd(tmp_path / CSV, tmp_path / "YouTubeClips")
    (tmp_path / "YouTubeClips" / "mv89psg6z00_0_1.avi").unlink()
    with pytest.raises(ConfigError, match="--videos"):
        data.clip_path("mv89psg6z00_0_1")


def test_features_are_computed_once_per_video_and_encoder_then_read_back(tmp_path):
    write_msrvtt(tmp_path / "c", splits=("train", "train", "test"))
    data = read_msrvtt(tmp_path / "c" / "train_val_videodatainfo.json", tmp_path / "c" / "TrainValVideo")
    clips = [data.clip_path(v) for v in ("video0", "video1", "video2")]
    cache = FeatureCache(tmp_path / "cache", DEMO_ENCODER, TF_NORM, Window(8, 8.0))
    first = cache.many(clips)
    assert first.shape == (3, 8, 128) and first.dtype == np.float32
    assert (cache.computed, cache.reused) == (3, 0)
    # The runtime's preprocessing on the runtime's sampled frames, frame by frame.
    encoder = TfliteFrameEncoder(DEMO_ENCODER, TF_NORM)
    direct = np.stack([encoder(f) for f in first_window(clips[1], Window(8, 8.0))])
    np.testing.assert_array_equal(first[1], direct)

    again = FeatureCache(tmp_path / "cache", DEMO_ENCODER, TF_NORM, Window(8, 8.0))
    np.testing.assert_array_equal(again.many(clips), first)
    assert (again.computed, again.reused) == (0, 3)
    assert again._encoder is None  # nothing cached was decoded or encoded again


def test_another_window_encoder_or_an_edited_video_is_computed_afresh(tmp_path):
    write_msrvtt(tmp_path / "c", splits=("train",))
    clip = tmp_path / "c" / "TrainValVideo" / "video0.mp4"
    FeatureCache(tmp_path / "cache", DEMO_ENCODER, TF_NORM, Window(8, 8.0)).features(clip)
    other = FeatureCache(tmp_path / "cache", DEMO_ENCODER, TF_NORM, Window(4, 8.0))
    assert other.features(clip).shape == (4, 128) and other.computed == 1
    st = clip.stat()
    os.utime(clip, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    edited = FeatureCache(tmp_path / "cache", DEMO_ENCODER, TF_NORM, Window(8, 8.0))
    edited.features(clip)
    assert (edited.computed, edited.reused) == (1, 0)
    assert len(list((tmp_path / "cache").iterdir())) == 2  # one folder per encoder and window


def test_a_torn_cache_entry_is_recomputed_not_trusted(tmp_path):
    write_msrvtt(tmp_path / "c", splits=("train",))
    clip = tmp_path / "c" / "TrainValVideo" / "video0.mp4"
    cache = FeatureCache(tmp_path / "cache", DEMO_ENCODER, TF_NORM)
    good = cache.features(clip)
    (entry,) = cache.folder.glob("*.npy")
    entry.write_bytes(entry.read_bytes()[:40])
    again = FeatureCache(tmp_path / "cache", DEMO_ENCODER, TF_NORM)
    np.testing.assert_array_equal(again.features(clip), good)
    assert again.computed == 1


def test_a_clip_shorter_than_a_window_is_one_line_naming_it(tmp_path):
    write_msrvtt(tmp_path / "c", splits=("train",))
    clip = tmp_path / "c" / "TrainValVideo" / "video0.mp4"
    with pytest.raises(ConfigError, match="shorter than one window of 40 frames") as e:
        FeatureCache(tmp_path / "cache", DEMO_ENCODER, TF_NORM, Window(40, 8.0)).features(clip)
    assert "video0.mp4" in str(e.value)
