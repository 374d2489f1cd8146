"""Command-line numbers checked against a documented range, and usage errors in one line.

Every numeric option of every edgecap command (``edgecap``, the compiler's
``python -m edgecap_lab.compile_benchmark``) is parsed by ``int_in`` or
``float_in``, so an absurd value (``--threads 32768``, which crashed
TFLite, or ``--tpus 1000000000``) is refused by argparse before any work.
``Parser`` reports that, and every other usage error, as edgecap's own
error: one line ``PROG: error: ...`` and exit code 2 from ``run_command``,
not argparse's usage block. The ranges are listed in docs/bad-input.md.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, NoReturn, Optional

from edgecap.errors import EdgecapError


def _shown(text: str) -> str:
    """The option's text as typed, quoted when it holds a character a line cannot show."""
    return text if text.isprintable() and text.strip() == text and text else repr(text)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors raise ``EdgecapError`` (one line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        """Raises the usage error for ``run_command`` to print.

        Raises:
          EdgecapError: Always, naming the problem and where the usage is.
        """
        raise EdgecapError(f"{message} (see {self.prog} --help)")


def int_in(low: int, high: int) -> Callable[[str], int]:
    """Returns an argparse type: a whole number from ``low`` to ``high``.

    Args:
      low: The smallest value accepted.
      high: The largest value accepted.

    Returns:
      A function that parses the option's text, raising ``argparse.ArgumentTypeError``.
    """
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{_shown(text)}: use a whole number from {low:,} to {high:,}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def int_or_auto(low: int, high: int) -> Callable[[str], Optional[int]]:
    """Returns an argparse type: ``auto`` (None: the default) or a whole number from ``low`` to ``high``.

    Args:
      low: The smallest value accepted.
      high: The largest value accepted.

    Returns:
      A function that parses the option's text, raising ``argparse.ArgumentTypeError``.
    """
    number = int_in(low, high)

    def parse(text: str) -> Optional[int]:
        if text == "auto":
            return None
        try:
            return number(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"{_shown(text)}: use auto or a whole number from {low:,} to {high:,}") from None

    parse.__name__ = "integer or auto"
    return parse


def float_in(low: float, high: float) -> Callable[[str], float]:
    """Returns an argparse type: a finite number from ``low`` to ``high``.

    Args:
      low: The smallest value accepted.
      high: The largest value accepted.

    Returns:
      A function that parses the option's text, raising ``argparse.ArgumentTypeError``.
    """
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{_shown(text)}: use a number from {low:g} to {high:g}")
        return value

    parse.__name__ = "number"
    return parse


def int_list_in(low: int, high: int) -> Callable[[str], list]:
    """Returns an argparse type: comma-separated whole numbers, each from ``low`` to ``high``.

    Args:
      low: The smallest value accepted.
      high: The largest value accepted.

    Returns:
      A function that parses the option's text into a non-empty list, raising
      ``argparse.ArgumentTypeError``.
    """
    one = int_in(low, high)

    def parse(text: str) -> list:
        try:
            values = [one(x) for x in text.split(",") if x.strip()]
        except argparse.ArgumentTypeError:
            values = []
        if not values:
            raise argparse.ArgumentTypeError(
                f"{_shown(text)}: use comma-separated whole numbers, each from {low:,} to {high:,}")
        return values

    parse.__name__ = "list"
    return parse
