"""pytest plugin of this project's own suite: a test that starts a subprocess must be marked ``slow``.

``make test-fast`` (``-m "not slow"``) is the quick loop; a subprocess (an interpreter start, a
compile in a child, a git call) in an unmarked test would make it slow again unnoticed. The guard
records every ``subprocess.Popen`` a test not marked ``slow`` creates and fails that test, naming
the command, after it ran.
"""

from __future__ import annotations

import subprocess

import pytest


@pytest.fixture(autouse=True)
def _subprocess_needs_slow_mark(request, monkeypatch):
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    started: list[str] = []
    real_init = subprocess.Popen.__init__

    def recording_init(self, args, *rest, **kwargs):
        started.append(args if isinstance(args, str) else " ".join(map(str, args)))
        return real_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", recording_init)
    yield
    if started:
        pytest.fail(f"{request.node.nodeid} starts a subprocess ({started[0][:120]}) but is not marked "
                    "@pytest.mark.slow", pytrace=False)
