"""The error the compiler raises for bad input; the CLI prints it as one line and exits 2."""

from __future__ import annotations

from edgecap.errors import EdgecapError


class CompileError(EdgecapError):
    """A model, board profile, calibration file or option the compiler cannot use."""
