"""The decoder's beam search: greedy at width 1, exhaustive when wide enough, and the caption's confidence."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Tuple

import numpy as np
import pytest

from edgecap.bundle import DEMO_DIR, load_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.cli import main
from edgecap.errors import ConfigError
from edgecap_lab.evaluate import evaluate
from edgecap.interpreter import make_cpu_interpreter
from edgecap.limits import DEFAULT_BEAM, MAX_BEAM
from edgecap.options import CaptionerOptions
from edgecap.preprocess import Preprocessor, dequantize
from edgecap.rnn import RnnDecoder, RnnEncoder, State, log_softmax, top_k
from edgecap.service.config import load_config
from edgecap.service.sinks import caption_record
from edgecap.sources import VideoFileSource, sample

REPO = Path(__file__).resolve().parent.parent


def _greedy(decoder: RnnDecoder, state: State, bos: int, eos: int, max_length: int
            ) -> Tuple[List[int], float]:
    """The decoder as it was before beam search (argmax each step), with its mean log-probability."""
    word, h, c = bos, state.h, state.c
    ids: List[int] = []
    log_probs: List[float] = []
    for _ in range(max_length):
        out = decoder._run({"word": np.array([word], np.int32), "h": h, "c": c})
        word = int(np.argmax(out["logits"][0]))
        log_probs.append(float(log_softmax(out["logits"][0])[word]))
        if word == eos:
            break
        ids.append(word)
        h, c = out["h_out"], out["c_out"]
    return ids, float(np.mean(log_probs))


@pytest.fixture(scope="module")
def demo():
    return load_bundle(DEMO_DIR / "bundle")


@pytest.fixture(scope="module")
def states(demo) -> List[State]:
    """Encoder states of the demo sample's windows, then random ones the decoder is unsure of."""
    cnn = make_cpu_interpreter(demo.encoder)
    (inp,), (out,) = cnn.get_input_details(), cnn.get_output_details()
    preprocess = Preprocessor(demo.input, inp)
    encoder = RnnEncoder(demo.encoder_step)
    with VideoFileSource(DEMO_DIR / "sample.mp4") as src:
        frames = [f.image for f in sample(src, demo.window.sample_fps)]
    found = []
    for start in range(0, len(frames) - demo.window.frames + 1, demo.window.frames):
        state = State.zeros(demo.hidden_size)
        for image in frames[start:start + demo.window.frames]:
            cnn.set_tensor(inp["index"], preprocess(image))
            cnn.invoke()
            state = encoder.step(dequantize(cnn.get_tensor(out["index"]), out), state)
        found.append(state)
    assert len(found) == 3
    rng = np.random.default_rng(0)
    for scale in (0.5, 1.0, 3.0):
        for _ in range(15):
            h, c = (rng.normal(0, scale, (1, demo.hidden_size)).astype(np.float32) for _ in "hc")
            found.append(State(h, c))
    return found


def test_a_beam_of_one_is_the_greedy_decoder_token_for_token(demo, states):
    decoder = RnnDecoder(demo.decoder_step)
    tok = demo.tokens
    captions = set()
    cut = 0
    for state in states:
        # The bundle's length, and 2 words, which cuts most captions (no eos term).
        for length in (demo.max_caption_length, 2):
            expected, mean = _greedy(decoder, state, tok.bos, tok.eos, length)
            got = decoder.decode(state, tok.bos, tok.eos, length, beam=1)
            assert got.tokens == expected
            assert got.confidence == pytest.approx(mean, abs=1e-9)
            assert got.confidence <= 0.0
            assert got.steps == min(len(expected) + 1, length)
            captions.add(tuple(expected))
            cut += len(expected) == length
    assert len(captions) > 5  # the states are varied enough to test something
    assert cut >= 3  # and some were cut at the length


def _every_caption(decoder: RnnDecoder, state: State, bos: int, eos: int, max_length: int
                   ) -> List[Tuple[List[int], float, int]]:
    """Every caption of at most ``max_length`` words: (tokens, summed log-probability, terms)."""
    found = []

    def walk(tokens: List[int], word: int, h: np.ndarray, c: np.ndarray, total: float) -> None:
        out = decoder._run({"word": np.array([word], np.int32), "h": h, "c": c})
        logp = log_softmax(out["logits"][0])
        found.append((tokens, total + logp[eos], len(tokens) + 1))
        for w in range(len(logp)):
            if w == eos:
                continue
            if len(tokens) + 1 == max_length:  # cut there, without an eos term
                found.append((tokens + [w], total + logp[w], max_length))
            else:
                walk(tokens + [w], w, out["h_out"], out["c_out"], total + logp[w])

    walk([], bos, state.h, state.c, 0.0)
    return found


def test_a_beam_as_wide_as_every_sequence_finds_the_best_one(demo, states):
    decoder = RnnDecoder(demo.decoder_step)
    tok, vocab = demo.tokens, len(demo.vocab)
    for state in states[:2] + states[-4:]:
        scored = _every_caption(decoder, state, tok.bos, tok.eos, 3)
        assert len(scored) == 1 + (vocab - 1) * (1 + (vocab - 1) * (1 + (vocab - 1)))
        for penalty in (0.0, 0.5, 1.0):
            best = max(scored, key=lambda s: s[1] / s[2] ** penalty)
            got = decoder.decode(state, tok.bos, tok.eos, 3, beam=vocab ** 3, length_penalty=penalty)
            assert got.tokens == best[0]
            assert got.confidence == pytest.approx(best[1] / best[2])


def test_length_normalisation_decides_between_lengths(demo, states):
    # With the plain sum a short caption wins more often than with the mean.
    decoder = RnnDecoder(demo.decoder_step)
    tok = demo.tokens
    lengths = {p: [len(decoder.decode(s, tok.bos, tok.eos, demo.max_caption_length, beam=5,
                                      length_penalty=p).tokens) for s in states]
               for p in (0.0, 1.0)}
    assert sum(lengths[0.0]) <= sum(lengths[1.0])
    assert lengths[0.0] != lengths[1.0]


def test_top_k_is_best_first_and_breaks_ties_by_the_lower_index():
    scores = np.array([[0.1, 0.5, 0.5], [0.5, -1.0, 0.2]])
    assert top_k(scores, 1).tolist() == [1] == [int(np.argmax(scores))]
    assert top_k(scores, 3).tolist() == [1, 2, 3]
    assert top_k(scores, 4).tolist() == [1, 2, 3, 5]
    assert top_k(scores, 10).tolist() == [1, 2, 3, 5, 0, 4]
    rng = np.random.default_rng(1)
    for _ in range(200):
        x = rng.integers(0, 4, (3, 7)).astype(float)  # many ties
        assert top_k(x, 1).tolist() == [int(np.argmax(x))]
        order = sorted(range(x.size), key=lambda i: (-x.ravel()[i], i))
        assert top_k(x, 5).tolist() == order[:5]


def test_captions_carry_the_decoders_confidence_at_the_chosen_width(demo, monkeypatch):
    widths = []
    decode = RnnDecoder.decode

    def spy(self, *args, **kwargs):
        got = decode(self, *args, **kwargs)
        widths.append((args[4] if len(args) > 4 else kwargs["beam"], got))
        return got

    monkeypatch.setattr(RnnDecoder, "decode", spy)
    for beam in (1, 4):
        widths.clear()
        with EdgeCaptioner(demo, beam=beam) as cap:
            captions = list(cap.stream(str(DEMO_DIR / "sample.mp4")))
        assert [w for w, _ in widths] == [beam] * len(captions) == [beam] * 3
        for caption, (_, decoded) in zip(captions, widths):
            assert caption.tokens == decoded.tokens
            assert caption.confidence == pytest.approx(decoded.confidence, abs=1e-6)
            assert -1.0 < caption.confidence < 0.0  # the demo is sure of its sample
            assert caption.to_dict()["confidence"] == caption.confidence
            # What the JSON-lines file, stdout's JSON and MQTT write.
            assert caption_record("cam", caption)["confidence"] == caption.confidence
    assert CaptionerOptions().beam == DEFAULT_BEAM


@pytest.mark.parametrize("beam", [0, -1, MAX_BEAM + 1, 2.0, True, "3"])
def test_an_out_of_range_beam_is_refused_in_one_line(beam):
    with pytest.raises(ConfigError) as info:
        CaptionerOptions(beam=beam)
    assert str(info.value).startswith(f"beam {beam}: use a whole number from 1 (greedy) to {MAX_BEAM}")


def _spy_widths(monkeypatch) -> List[int]:
    widths: List[int] = []
    decode = RnnDecoder.decode

    def spy(self, state, bos, eos, max_length, beam=1, length_penalty=1.0):
        widths.append(beam)
        return decode(self, state, bos, eos, max_length, beam, length_penalty)

    monkeypatch.setattr(RnnDecoder, "decode", spy)
    return widths


def test_the_json_lines_of_caption_carry_the_confidence_and_the_beam_flag_reaches_it(capfd, monkeypatch):
    widths = _spy_widths(monkeypatch)
    assert main(["caption", "--json", "--beam", "3"]) == 0
    records = [json.loads(line) for line in capfd.readouterr().out.splitlines()]
    assert len(records) == 3 and widths == [3, 3, 3]
    assert all(-1.0 < r["confidence"] < 0.0 for r in records)


def test_the_beam_flag_reaches_eval_and_bench(tmp_path, monkeypatch, capfd):
    from edgecap_lab import bench
    from models.dataset import write_dataset

    data = write_dataset(tmp_path / "data", 2, seed=4343, split_fractions=(0, 0, 1))
    widths = _spy_widths(monkeypatch)
    assert main(["eval", "--data", str(data.root), "--beam", "4", "--out", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["beam"] == 4
    assert set(widths) == {4} and len(widths) == 4  # two clips, int8 and float encoder
    assert "(mean log-probability per token; beam 4)" in capfd.readouterr().out

    seen = {}

    def run_bench(*args, **kwargs):
        seen.update(kwargs)
        raise ConfigError("stop here")

    monkeypatch.setattr(bench, "run_bench", run_bench)
    assert main(["bench", "--beam", "5"]) == 2
    assert seen["beam"] == 5


@pytest.mark.parametrize("value, problem", [
    ("0", "must be int >= 1"), (str(MAX_BEAM + 1), f"must be int <= {MAX_BEAM}"),
    ('"wide"', "must be int, got str"), ("2.5", "must be int, got float")])
def test_the_service_configs_beam_is_typed_with_a_one_line_error(tmp_path, value, problem):
    path = tmp_path / "edgecap.toml"
    path.write_text(textwrap.dedent(f"""\
        beam = {value}
        [[cameras]]
        name = "cam"
        source = "/dev/video0"
        """))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:1: beam: {problem}"), message
    assert message.endswith(f"from 1 (greedy) to {MAX_BEAM} (default {DEFAULT_BEAM})")


def test_the_service_config_takes_a_beam_and_defaults_to_the_runtimes(tmp_path):
    path = tmp_path / "edgecap.toml"
    cameras = '[[cameras]]\nname = "cam"\nsource = "/dev/video0"\n'
    path.write_text(cameras)
    assert load_config(path).beam == DEFAULT_BEAM
    path.write_text("beam = 5\n" + cameras)
    assert load_config(path).beam == 5


def test_the_beam_bench_scores_what_edgecap_eval_scores(tmp_path):
    from models.dataset import write_dataset

    data = write_dataset(tmp_path / "data", 6, seed=4242, split_fractions=(0, 0, 1))
    out = tmp_path / "beam.json"
    done = subprocess.run([sys.executable, str(REPO / "tools" / "beam_bench.py"), "--data", str(data.root),
                           "--widths", "2", "--json", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {r["beam"]: r for r in json.loads(out.read_text())["rows"]}
    assert sorted(rows) == [1, 2]  # greedy is always measured: "changed" compares with it
    assert "exact" in done.stdout and "devboard ms" in done.stdout
    for beam, row in rows.items():
        report = evaluate(DEMO_DIR / "bundle", data.root, beam=beam)
        assert report.beam == beam
        assert (row["clips"], row["exact_match"], row["bleu4"]) == \
            (report.clips, report.exact_match, pytest.approx(report.bleu4))
        assert row["confidence"] == pytest.approx(report.confidence, abs=1e-5)
        assert row["steps"] >= beam * 5 - 1 and row["board_ms"] > 0 and row["host_ms"] > 0


def test_the_beam_bench_auc_is_the_chance_a_match_is_surer_than_a_miss(monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("beam_bench", REPO / "tools" / "beam_bench.py")
    tool = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "beam_bench", tool)  # its dataclass looks itself up there
    spec.loader.exec_module(tool)
    assert tool.auc([-0.1, -0.2], [-0.3, -0.2]) == pytest.approx((1 + 1 + 1 + 0.5) / 4)
    assert tool.auc([-0.1], [-0.5, -0.6]) == 1.0 and tool.auc([-0.9], [-0.5]) == 0.0
    assert tool.auc([], [-0.5]) is None and tool.auc([-0.5], []) is None
