"""Bounds no real value reaches, shared by the API's option checks and the command line's.

Past them a value is a typo or hostile, and is refused before any work:
``CaptionerOptions`` checks them for the Python API, ``edgecap.cli`` parses
its flags against them (docs/bad-input.md lists every option's range).
"""

MAX_WINDOW_FRAMES = 10_000  # frames per window, stride
MAX_SAMPLE_FPS = 10_000.0
MAX_QUEUE = 1024  # frames a queue holds, frames per hand-off
MAX_DEADLINE = 1e6
# CPU threads of one interpreter: more than any board's or host's cores
# (TFLite crashed at 32768).
MAX_THREADS = 256
# Hypotheses of the decoder's beam search: each costs a decoder step per word,
# and past the vocabulary's size a wider beam finds nothing more.
MAX_BEAM = 64
# The default width, greedy: on the models measured a wider beam did not caption
# better (results/beam-bench.json; docs/runtime.md, Beam search).
DEFAULT_BEAM = 1
# An emulated device's speed factor ($EDGECAP_EMULATE speed:F): past 100x either
# way a pace is a typo (a 0.001 factor would make a 1 ms invoke take a second).
MIN_EMULATED_SPEED = 0.01
MAX_EMULATED_SPEED = 100.0
# Seconds before an emulated device throttles (throttle:Ts): a day is past any run.
MAX_THROTTLE_S = 86_400.0
# Camera indices: OpenCV adds a backend's number to an index (CAP_V4L2 + 1 is
# 201), and its largest backend numbers are below 3000; -1 ("any camera")
# crashes inside OpenCV 5.
MAX_CAMERA_INDEX = 9_999
# Candidate plans `edgecap compile --into-bundle` writes per board (docs/bundle.md):
# how many, and how many megabytes (10^6 bytes) they may add to the bundle. The
# default count covers a TPU missing and each device off its profile on a
# two-TPU board; the default size keeps a ResNet-50 bundle (54 MB) under three
# times its size on a board's SD card.
DEFAULT_CANDIDATES = 8
MAX_CANDIDATES = 64
DEFAULT_CANDIDATES_MB = 100.0
MAX_CANDIDATES_MB = 100_000.0
# bench --host-rounds: each host row runs this often, the rows interleaved; a row is its median round.
DEFAULT_HOST_ROUNDS = 3
MAX_HOST_ROUNDS = 100
