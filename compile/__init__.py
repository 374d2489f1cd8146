"""edgecap_compile: the host-side compiler that splits an int8 CNN into EdgeTPU segments and a CPU tail.

Run it as ``edgecap compile`` / ``edgecap calibrate``; from Python, ``compile_model``.
The runtime reaches it through one door, ``edgecap.planning`` (planning for a
board on the fly), and only through the names exported here.
"""

from edgecap_compile.compiler import CompileResult, compile_model, make_board
from edgecap_compile.edgetpu import find_compiler
from edgecap_compile.errors import CompileError

__all__ = ["CompileError", "CompileResult", "compile_model", "find_compiler", "make_board"]
