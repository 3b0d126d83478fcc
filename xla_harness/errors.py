"""The project's one exception type.

Every error a user can cause (bad flags, unreadable files, a results file from a
different run) is raised as :class:`HarnessError` with one clear sentence. The CLI
prints it as ``error: <sentence>`` and exits with status 2.
"""


class HarnessError(Exception):
    """A user-facing error: one sentence, no traceback."""

    exit_code = 2
