"""The project's one exception type.

Every error a user can cause (bad flags, unreadable files, a results file from a
different run) is raised as :class:`HarnessError` with one clear sentence. The CLI
prints it as ``error: <sentence>`` and exits with status 2.
"""


import re


class HarnessError(Exception):
    """A user-facing error: one sentence, no traceback."""

    exit_code = 2


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(text: str) -> str:
    """``text`` as one printable line: control characters (a newline, ``\\x01`` from a user's argument)
    written as escapes, so an ``error:`` line is one line and shows what was given."""
    return _CONTROL.sub(lambda m: {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(m.group(), f"\\x{ord(m.group()):02x}"),
                        text)
