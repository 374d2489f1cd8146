"""Bad bundle.json documents and bundle files are refused by load_bundle in one line (issue #10 item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgecap.bundle import load_bundle
from edgecap.errors import BundleError


def _edit(bundle: Path, edit) -> None:
    doc = json.loads((bundle / "bundle.json").read_text())
    edit(doc)
    (bundle / "bundle.json").write_text(json.dumps(doc))  # NaN and Infinity as Python writes them


def _refused(bundle: Path, match: str) -> str:
    with pytest.raises(BundleError, match=match) as err:
        load_bundle(bundle)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(feature_size="128"), r"field 'feature_size' must be int, got str"),
    (lambda d: d["rnn"].update(hidden_size=[128]), r"field 'rnn.hidden_size' must be int, got array"),
    (lambda d: d.pop("tokens"), r"field 'tokens' is missing"),
    (lambda d: d["rnn"].pop("decoder_step"), r"field 'rnn.decoder_step' is missing"),
    (lambda d: d["window"].update(sample_fps=float("nan")), r"field 'window.sample_fps' must be float >= 0.0"),
    (lambda d: d["window"].update(sample_fps=float("inf")), r"field 'window.sample_fps' must be float <= 10000.0"),
    (lambda d: d["input"].update(std=[float("-inf")] * 3), r"field 'input.std\[0\]' must be float > 0.0"),
    (lambda d: d["input"].update(height=-64), r"field 'input.height' must be int >= 1"),
    (lambda d: d["window"].update(frames=10**30), r"field 'window.frames' must be int <= 10000"),
    (lambda d: d.update(max_caption_length=0), r"field 'max_caption_length' must be int >= 1"),
    (lambda d: d.update(schema_version=2), r"field 'schema_version' is 2, this edgecap reads version 1"),
    (lambda d: d["tokens"].update(eos=d["tokens"]["bos"]),
     r"fields 'tokens.bos' and 'tokens.eos' are both \d+: give the start and the end of a caption different ids"),
])
def test_wrong_types_missing_keys_nan_and_absurd_sizes(bundle_copy: Path, edit, match: str) -> None:
    _edit(bundle_copy, edit)
    msg = _refused(bundle_copy, match)
    assert msg.startswith(str(bundle_copy / "bundle.json"))


def test_bytes_that_are_not_utf8_in_a_key_edgecap_does_not_read(bundle_copy: Path) -> None:
    # Found by the fuzz (results/fuzz.json): the typed decode skipped the key, the decode for meta raised.
    path = bundle_copy / "bundle.json"
    path.write_bytes(path.read_bytes().replace(b'"name"', b'"\xffname"', 1))
    _refused(bundle_copy, r"bundle.json: not valid JSON \(.*UTF-8.*\); fix it or re-export")


@pytest.mark.parametrize("field, value, match", [
    ("vocab", "../../etc/passwd", r"field 'vocab' path '../../etc/passwd' leaves the bundle directory"),
    ("encoder", "/etc/passwd", r"field 'encoder' path '/etc/passwd' leaves the bundle directory"),
    ("vocab", "a\x00b", r"field 'vocab' path 'a\\x00b' is not a usable file name"),
    ("vocab", "\ud800", r"bundle.json: not valid JSON \(a string that is not valid Unicode, such as a lone surrogate"),
    ("vocab", "x" * 300, r"field 'vocab' path 'x{60}.*' is not a usable file name"),
    ("rnn.decoder_step", "step\n.tflite", r"field 'rnn.decoder_step' path 'step\\n.tflite' is not a usable file "
                                          r"name \(it contains a control character\)"),
])
def test_paths_out_of_the_directory_or_unusable(bundle_copy: Path, field: str, value: str, match: str) -> None:
    def edit(doc):
        *parents, key = field.split(".")
        for p in parents:
            doc = doc[p]
        doc[key] = value
    _edit(bundle_copy, edit)
    _refused(bundle_copy, match)


def test_a_symlink_out_of_the_directory(bundle_copy: Path, shipped_bundle: Path) -> None:
    (bundle_copy / "vocab.txt").unlink()
    (bundle_copy / "vocab.txt").symlink_to(shipped_bundle / "vocab.txt")
    _refused(bundle_copy, r"field 'vocab' path 'vocab.txt' leaves the bundle directory .*: keep every file")


@pytest.mark.parametrize("name", ["vocab.txt", "encoder.tflite", "encoder_float.tflite"])
def test_a_directory_where_a_file_belongs(bundle_copy: Path, name: str) -> None:
    (bundle_copy / name).unlink()
    (bundle_copy / name).mkdir()
    _refused(bundle_copy, rf"{name}: field '.*' of .*bundle.json names a directory: name the file")


def test_a_directory_where_bundle_json_belongs(bundle_copy: Path) -> None:
    (bundle_copy / "bundle.json").unlink()
    (bundle_copy / "bundle.json").mkdir()
    _refused(bundle_copy, r"bundle.json: is a directory, not a bundle.json")


@pytest.mark.parametrize("name", ["bundle.json", "vocab.txt", "encoder.tflite", "rnn_decoder_step.tflite",
                                  "encoder_float.tflite"])
def test_unreadable_files_are_named_as_such(bundle_copy: Path, monkeypatch, name: str) -> None:
    # Tests run as root here, where chmod does not deny a read: the read itself is made to fail.
    target = bundle_copy / name
    real = os.open

    def denied(path, *a, **k):
        if Path(path).resolve() == target.resolve():
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "open", denied)  # every file is opened by edgecap.files
    _refused(bundle_copy, rf"{name}: permission denied.* readable by this user")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads a mode-000 file anyway")
def test_an_unreadable_vocabulary_for_real(bundle_copy: Path) -> None:
    (bundle_copy / "vocab.txt").chmod(0)
    _refused(bundle_copy, "permission denied")


@pytest.mark.parametrize("edit, match", [
    (lambda text: text + "extra\n", r"vocab.txt: 26 tokens but rnn_decoder_step.tflite emits 25 logits: use "
                                    r"the vocabulary the decoder was trained with"),
    (lambda text: "\n".join(text.splitlines()[:-3]) + "\n", r"22 tokens but .* emits 25 logits"),
    (lambda text: "", r"vocab.txt: empty vocabulary"),
])
def test_a_vocabulary_that_does_not_match_the_decoder(bundle_copy: Path, edit, match: str) -> None:
    vocab = bundle_copy / "vocab.txt"
    vocab.write_text(edit(vocab.read_text()))
    _refused(bundle_copy, match)


def test_a_vocabulary_that_is_not_utf8(bundle_copy: Path) -> None:
    (bundle_copy / "vocab.txt").write_bytes(b"\xff\xfe\n" * 25)
    _refused(bundle_copy, r"vocab.txt: not UTF-8 text")


def test_the_cli_prints_one_line(bundle_copy: Path) -> None:
    _edit(bundle_copy, lambda d: d["window"].update(stride=float("nan")))
    proc = subprocess.run([sys.executable, "-m", "edgecap.cli", "validate", str(bundle_copy)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "field 'window.stride' must be int, got float" in lines[0], proc.stderr
