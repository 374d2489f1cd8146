"""edgecap_compile: the host-side compiler that splits an int8 CNN into EdgeTPU segments and a CPU tail.

Run it as ``edgecap compile`` / ``edgecap calibrate``; from Python, ``compile_model``.
The runtime never imports this package.
"""

from edgecap_compile.compiler import CompileResult, compile_model
from edgecap_compile.errors import CompileError

__all__ = ["CompileError", "CompileResult", "compile_model"]
