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
# better (docs/beam-bench.json; docs/runtime.md, Beam search).
DEFAULT_BEAM = 1
# bench --host-rounds: each host row runs this often, the rows interleaved; a row is its median round.
DEFAULT_HOST_ROUNDS = 3
MAX_HOST_ROUNDS = 100
