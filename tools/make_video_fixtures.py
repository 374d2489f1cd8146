"""Writes the video fixtures of tests/test_video_sources.py from the demo's sample clip, with ffmpeg.

Each fixture is a file as phones, web downloads and cut-off recorders make
them (docs/bad-input.md, "Videos as they come"). Run from the repository root:

    python tools/make_video_fixtures.py [--out tests/data/video]

Needs ffmpeg on PATH (apt-get install ffmpeg); the committed fixtures were made
with ffmpeg 5.1 (Debian 12).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent.parent / "models" / "demo" / "sample.mp4"


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", *args], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/video"))
    args = parser.parse_args()
    if shutil.which("ffmpeg") is None:
        print("make_video_fixtures: ffmpeg is not on PATH: apt-get install ffmpeg", file=sys.stderr)
        return 2
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    s = str(SAMPLE)
    # Variable frame rate: 24 frames at 8 fps (0-2.875 s), then 24 at 32 fps from 3.0 s.
    _ffmpeg("-i", s, "-vf", "setpts='if(lt(N,24),N/8/TB,(3+(N-24)/32)/TB)'", "-fps_mode", "vfr",
            "-enc_time_base", "1/1000", "-video_track_timescale", "1000", "-c:v", "mpeg4",
            "-q:v", "8", str(out / "vfr.mp4"))
    # A high-speed clip: 48 frames at 1200 fps (40 ms).
    _ffmpeg("-i", s, "-vf", "setpts=N/1200/TB", "-r", "1200", "-c:v", "mpeg4", "-q:v", "8",
            str(out / "fast1200.mp4"))
    # The index (moov) written last, as recorders do; then the same cut off before it.
    _ffmpeg("-i", s, "-c:v", "mpeg4", "-q:v", "8", str(out / "moov_at_end.mp4"))
    data = (out / "moov_at_end.mp4").read_bytes()
    (out / "moov_lost.mp4").write_bytes(data[: len(data) // 2])
    # Motion-JPEG AVI: whole; cut off in the middle; written to a pipe (no index, no
    # frame count); written to a pipe and cut off, as a recorder killed mid-file.
    _ffmpeg("-i", s, "-c:v", "mjpeg", "-q:v", "12", str(out / "whole.avi"))
    data = (out / "whole.avi").read_bytes()
    (out / "cut.avi").write_bytes(data[: len(data) * 6 // 10])
    piped = subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-i", s, "-c:v",
                            "mjpeg", "-q:v", "12", "-f", "avi", "pipe:1"],
                           check=True, capture_output=True).stdout
    (out / "piped.avi").write_bytes(piped)
    (out / "piped_cut.avi").write_bytes(piped[: len(piped) * 6 // 10])
    # Rotation metadata (a phone held upright): 160x96 stored, shown 96x160.
    _ffmpeg("-i", s, "-vf", "scale=160:96", "-frames:v", "8", "-c:v", "mpeg4", "-q:v", "8",
            str(out / "wide.mp4"))
    _ffmpeg("-i", str(out / "wide.mp4"), "-c", "copy", "-metadata:s:v:0", "rotate=90",
            str(out / "rotated.mp4"))
    (out / "wide.mp4").unlink()
    # 720p and 1080p (16:9), a few frames each.
    for height in (720, 1080):
        _ffmpeg("-i", s, "-vf", f"scale={height * 16 // 9}:{height}", "-frames:v", "4", "-c:v", "mpeg4",
                "-q:v", "20", str(out / f"hd{height}.mp4"))
    for p in sorted(out.iterdir()):
        print(f"{p.stat().st_size:>8}  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
