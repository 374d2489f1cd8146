"""Long structural fuzz of model files: the demo bundle's models and Coral's real ones.

    .venv-test/bin/python tools/fuzz_models.py [--mutants 20000] [--seed 1] [--json results/model-fuzz.json]
        [--coral /work/.mirror/google-coral+test_data/repo]

Mutates operators' inputs and outputs, tensors' shapes, types, buffers and
quantization, operator codes and subgraph boundaries (edgecap_lab.model_fuzz) and
opens each mutant as edgecap opens a bundle's model: the verifier, the first
invoke in a child process, the interpreter, one invoke. The goal: every
mutant refused in one line or run, no native crash of the process opening it.
Coral's models come from a local git mirror of google-coral/test_data
(Apache-2.0; ``--coral``, a bare repository or a checkout); without it only
the demo's and the repository's fixtures are mutated. Prints a table and
writes it, with every crash and finding, as JSON. Figures are measured on
this host.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

from edgecap_lab import model_fuzz

DEFAULT_MIRROR = Path("/work/.mirror/google-coral+test_data/repo")
# Coral models under about 1 MB whose first invoke takes milliseconds (the big
# segmentation and detection models would spend the run invoking): uint8 CNNs,
# an LSTM, EdgeTPU-compiled files (a custom op the CPU cannot run), a custom
# decoder op, several outputs.
CORAL_MODELS = [
    "mobilenet_v1_0.25_128_quant.tflite",
    "mobilenet_v1_0.25_128_quant_edgetpu.tflite",
    "keras_lstm_mnist_ptq_edgetpu.tflite",
    "tools/split_concat_edgetpu.tflite",
    "tools/mobilenet_quant_v1_224_head_layers.tflite",
    "posenet/posenet_mobilenet_v1_075_353_481_16_quant_decoder.tflite",
    "pipeline/ssd_mobilenet_v2_coco_quant_postprocess_segment_1_of_4_edgetpu.tflite",
]


def coral_models(mirror: Path, into: Path) -> List[Path]:
    """Copies ``CORAL_MODELS`` out of a mirror (bare git repository or checkout); [] where absent."""
    out = []
    for name in CORAL_MODELS:
        dest = into / Path(name).name
        if (mirror / name).is_file():
            dest.write_bytes((mirror / name).read_bytes())
        else:
            done = subprocess.run(["git", "-C", str(mirror), "show", f"HEAD:{name}"], capture_output=True)
            if done.returncode != 0 or done.stdout[4:8] != b"TFL3":  # absent, or an LFS pointer
                continue
            dest.write_bytes(done.stdout)
        out.append(dest)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="write the tally here")
    ap.add_argument("--coral", type=Path, default=DEFAULT_MIRROR, help="google-coral/test_data mirror")
    ap.add_argument("--keep", type=Path, default=None, help="copy crashing mutants into this folder")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgecap-coral-") as tmp:
        coral = coral_models(args.coral, Path(tmp)) if args.coral.exists() else []
        bases = model_fuzz.DEMO_BASES + model_fuzz.REAL_BASES + coral
        start = time.monotonic()
        last = [start]

        def progress(tally: model_fuzz.Tally) -> None:
            now = time.monotonic()
            if now - last[0] > 30:
                last[0] = now
                print(f"{tally.mutants} mutants, {now - start:.0f} s: {tally.outcomes}", flush=True)

        tally = model_fuzz.run(bases, args.mutants, args.seed, keep=args.keep, progress=progress)
        wall = time.monotonic() - start
    print(f"\n{tally.mutants} mutants of {len(bases)} models in {wall:.0f} s (measured, this host)")
    print(f"{'outcome / check':<28}{'mutants':>9}")
    for outcome, n in sorted(tally.outcomes.items()):
        print(f"{outcome:<28}{n:>9}")
        if outcome == "refused":
            for check, k in sorted(tally.refused_by.items(), key=lambda kv: -kv[1]):
                print(f"  by {check:<24}{k:>9}")
    print(f"native crashes of the opening process: {len(tally.crashes)}; other findings: {len(tally.findings)}")
    if args.json:
        doc = {
            "about": ("Structural fuzz of .tflite models opened as edgecap opens a bundle's model "
                      "(tools/fuzz_models.py; edgecap_lab.model_fuzz). Measured on this host."),
            "command": " ".join(["tools/fuzz_models.py", *sys.argv[1:]]),
            "host": {"machine": platform.machine(), "python": platform.python_version()},
            "seed": args.seed, "wall_s": round(wall, 1),
            "bases": [p.name for p in bases],
            "mutants": tally.mutants, "outcomes": tally.outcomes, "refused_by": tally.refused_by,
            "by_base": tally.by_base, "example_refusals": tally.examples,
            "crashes": tally.crashes, "findings": tally.findings,
            "child_invoke_refusals": tally.child_refusals,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if tally.crashes or tally.findings else 0


if __name__ == "__main__":
    sys.exit(main())
