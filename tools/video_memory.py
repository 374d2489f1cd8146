"""Peak memory of `edgecap caption` on clips from 128x128 to 8K (measured on this host).

    python tools/video_memory.py --json results/video-memory.json [--codec mp4v|h264]

Each clip is the demo's sample clip scaled up (48 frames, written with OpenCV's
mp4v writer, or with ffmpeg's libx264 for ``--codec h264``); each caption runs
in its own child process, whose peak resident set (``ru_maxrss``) is read when
it ends. It prints a table and writes JSON; the captions must equal the sample
clip's at every size (a frame scaled down on reading must not change what is
said).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "models" / "demo" / "sample.mp4"
SIZES = {"128x128": (128, 128), "1080p": (1920, 1080), "4K": (3840, 2160), "8K": (7680, 4320)}


def _write(path: Path, size: tuple, codec: str) -> None:
    if codec == "h264":
        subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-i", str(SAMPLE),
                        "-vf", f"scale={size[0]}:{size[1]}", "-c:v", "libx264", "-preset",
                        "ultrafast", str(path)], check=True)
        return
    cap = cv2.VideoCapture(str(SAMPLE))
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 16, size)
    while True:
        ok, image = cap.read()
        if not ok:
            break
        writer.write(cv2.resize(image, size, interpolation=cv2.INTER_NEAREST))
    writer.release()
    cap.release()


def _caption(clip: Path) -> dict:
    edgecap = Path(sys.executable).with_name("edgecap")
    started = time.monotonic()
    # ru_maxrss of RUSAGE_CHILDREN is the largest child's so far: /usr/bin/time reports each one's.
    out = subprocess.run(["/usr/bin/time", "-f", "%M", str(edgecap), "caption", str(clip)],
                         capture_output=True, text=True)
    lines = out.stderr.strip().splitlines()
    return {"exit": out.returncode, "peak_rss_mb": round(int(lines[-1]) / 1024, 1),
            "seconds": round(time.monotonic() - started, 1),
            "captions": [l.split("] ", 1)[1] for l in out.stdout.splitlines() if l.startswith("[")]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--codec", choices=("mp4v", "h264"), default="mp4v")
    args = parser.parse_args()
    if not Path("/usr/bin/time").exists():
        print("video_memory: /usr/bin/time is missing: apt-get install time", file=sys.stderr)
        return 2
    if args.codec == "h264" and shutil.which("ffmpeg") is None:
        print("video_memory: --codec h264 needs ffmpeg on PATH", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, size in SIZES.items():
            clip = Path(tmp) / f"{name}.mp4"
            _write(clip, size, args.codec)
            row = {"size": name, "width": size[0], "height": size[1], "codec": args.codec,
                   "file_mb": round(clip.stat().st_size / 2**20, 1), **_caption(clip)}
            rows.append(row)
            print(f"{name:>8} {row['file_mb']:>7.1f} MB file  peak RSS {row['peak_rss_mb']:>7.1f} MB "
                  f"(measured)  {row['seconds']:>6.1f} s  exit {row['exit']}", flush=True)
    same = all(r["captions"] == rows[0]["captions"] for r in rows)
    print(f"captions equal at every size: {same}")
    args.json.write_text(json.dumps({
        "command": " ".join(["python", "tools/video_memory.py", *sys.argv[1:]]),
        "host": platform.platform(), "opencv": cv2.__version__, "measured": True,
        "rows": rows, "captions_equal": same}, indent=2) + "\n")
    return 0 if same and all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
