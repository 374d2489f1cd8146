"""edgecap_compile: the host-side compiler that splits an int8 CNN into EdgeTPU segments and a CPU tail.

Run it as ``edgecap compile`` / ``edgecap calibrate``; from Python, ``compile_model``.
The runtime reaches it through one door, ``edgecap.plans.compiler`` (planning for a
board on the fly), and only through the names exported here.
"""

from edgecap_compile.errors import CompileError


def _litert_version() -> str:
    """Returns the installed ai-edge-litert's version in words, for the message below."""
    from importlib import metadata

    try:
        return f"ai-edge-litert {metadata.version('ai-edge-litert')}"
    except metadata.PackageNotFoundError:
        return "this install (no ai-edge-litert)"


# The compiler reads and writes models with ai-edge-litert's flatbuffer_utils,
# which came in 2.1.0 (1.4.0, the last aarch64 wheel for glibc < 2.27, and
# tflite_runtime lack it): refuse in one line here, before the imports below
# fail deep inside with a traceback.
try:
    from ai_edge_litert.tools import flatbuffer_utils as _flatbuffer_utils  # noqa: F401
except ImportError:
    raise CompileError(
        f"the compiler needs ai_edge_litert.tools.flatbuffer_utils, which {_litert_version()} "
        "lacks (ai-edge-litert >= 2.1 has it): pip install 'ai-edge-litert>=2.1' where the "
        "platform has it, or compile on an x86-64 host and copy the plan to the board; the "
        "runtime needs no compiler") from None

from edgecap_compile.compiler import CompileResult, compile_model, make_board  # noqa: E402
from edgecap_compile.edgetpu import find_compiler  # noqa: E402
from edgecap_compile.scenario_plans import corrected_board  # noqa: E402


def equal_param_ranges(model, n_tpus: int):
    """Returns the op ranges of the split ``edgetpu_compiler --num_segments N`` makes.

    N TPU segments of about equal parameter bytes over the whole model and an
    empty CPU stage: the baseline ``edgecap bench`` runs (``compile_model``'s
    ``ranges``).

    Args:
      model: A .tflite path or bytes.
      n_tpus: Number of TPU segments.

    Returns:
      ``((start, end), ...)``: one op range per TPU, then the CPU's.
    """
    import numpy as np

    from edgecap_compile.graph import read_graph
    from edgecap_compile.partitioner import equal_param_split

    ops = read_graph(model).ops
    prefix = np.concatenate([[0], np.cumsum([op.param_bytes for op in ops], dtype=np.int64)])
    unused = [np.zeros((len(ops) + 1, len(ops) + 1))] * (n_tpus + 1)  # only the cuts are wanted
    return equal_param_split(unused, prefix, n_tpus).ranges


__all__ = ["CompileError", "CompileResult", "compile_model", "corrected_board", "equal_param_ranges",
           "find_compiler", "make_board"]
