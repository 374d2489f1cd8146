"""edgecap.sources on each OpenCV pip takes: 5.x beside numpy 2, 4.11 beside numpy<2.

numpy<2 (Coral's libedgetpu 16.0 needs tflite-runtime 2.11, built against numpy 1.x)
makes pip take opencv-python-headless 4.11, which has no ``cv2.utils.logging``: since
2e8a405 ``import edgecap.sources`` failed there. ``make test-numpy1`` (run by CI) runs
this file and tests/test_sources.py in such a venv; tools/aarch64/check.sh py39 too.
"""

from __future__ import annotations

import os
import subprocess
import sys

import cv2
import numpy as np
import pytest


def _level() -> int:
    utils_logging = getattr(cv2.utils, "logging", None)
    return utils_logging.getLogLevel() if utils_logging is not None else cv2.getLogLevel()


def test_sources_imports_and_silences_opencv_on_this_opencv() -> None:
    import edgecap.sources  # noqa: F401  (failed with AttributeError on OpenCV 4.11)

    if "OPENCV_LOG_LEVEL" in os.environ:
        pytest.skip("OPENCV_LOG_LEVEL is set: edgecap keeps the caller's level")
    assert _level() == 0, f"OpenCV {cv2.__version__} (numpy {np.__version__}) logs at level {_level()}"


@pytest.mark.skipif(sys.platform != "linux", reason="the level variable is read the same everywhere")
def test_a_level_the_caller_set_is_kept() -> None:
    code = ("import cv2, edgecap.sources; u = getattr(cv2.utils, 'logging', None); "
            "print(u.getLogLevel() if u else cv2.getLogLevel())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OPENCV_LOG_LEVEL": "INFO"})
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout.split()[-1] == "4"  # LOG_LEVEL_INFO
