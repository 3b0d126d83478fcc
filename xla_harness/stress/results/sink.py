"""The results sink: block records appended to the results file from a thread of its own, so the
loop that dispatches steps never waits for a line's validation, encoding, write or fsync.

Every line is still written whole, flushed and fsynced by the file's one writer
(:class:`~xla_harness.stress.results.store.RunWriter`), in order. :meth:`ResultsSink.drain` waits until
every line appended so far is on disk: a ``--resume`` checkpoint is written only after it (never
ahead of the records), and the run drains before it reports or ends. A line still queued when the
process is killed is not lost work: ``--resume`` runs its steps again. An error writing (a full
disk) is raised in the loop at its next append or drain.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Protocol

from xla_harness.errors import HarnessError


class BlockStore(Protocol):
    """Where a (configuration, seed)'s block lines go (:func:`~xla_harness.stress.runner.run_seed`):
    ``append`` a line, ``drain`` until every line appended is on disk (before a checkpoint, which must
    never be ahead of the records), and the CPU time one line costs to write (what the block sizer
    counts as a block's host cost)."""

    def append(self, record) -> None: ...

    def drain(self) -> None: ...

    def line_cpu_seconds(self) -> float: ...


class ResultsSink:
    """Appends records to ``writer`` (anything with ``append(record)``) from a writer thread."""

    def __init__(self, writer) -> None:
        self.writer = writer
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self.lines = 0  # written by the thread, and its CPU time for them (what a line costs the process)
        self.cpu_seconds = 0.0
        self._thread = threading.Thread(target=self._work, name="xla-harness-results-writer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            record = self._queue.get()
            try:
                if record is None:
                    return
                if self._error is None:
                    t0 = time.thread_time()
                    self.writer.append(record)
                    self.cpu_seconds += time.thread_time() - t0
                    self.lines += 1
            except BaseException as exc:  # noqa: BLE001 - handed to the loop at its next call
                self._error = exc
            finally:
                self._queue.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            if isinstance(err, HarnessError):
                raise err
            raise HarnessError(f"internal: writing results failed ({type(err).__name__}: {err})") from err

    def append(self, record) -> None:
        self._raise()
        if not self._thread.is_alive():
            raise HarnessError("internal: a results line appended after the results sink was closed")
        self._queue.put(record)

    def line_cpu_seconds(self) -> float:
        """The writer thread's CPU time per line so far (0 before the first)."""
        return self.cpu_seconds / self.lines if self.lines else 0.0

    def drain(self) -> None:
        """Wait until every line appended so far is written and fsynced."""
        self._queue.join()
        self._raise()

    def close(self) -> None:
        """Drain, then end the writer thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._raise()

    def __enter__(self) -> ResultsSink:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
            return
        with contextlib.suppress(HarnessError):  # an error in the loop: keep what was written, report the loop's
            self.close()
