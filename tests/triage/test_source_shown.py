"""The report's source column names the user's own line first: a scatter Flax's ``Embed`` emits shows
the model file's frame that called it, then the library frame after "via"; a frame already in the
user's files is shown alone; no path of this machine is shown."""

from __future__ import annotations

import pytest

from xla_harness.triage.render import source_shown

FLAX = "/opt/venv/lib/python3.12/site-packages/flax/linen/linear.py:1184 (Embed.__call__)"
USER = "/srv/me/lm/models.py:88 (TiedLM.__call__)"


@pytest.mark.parametrize("source, want", [
    (f"{FLAX} <- {USER} <- /srv/me/lm/train.py:12 (loss)",
     "/srv/me/lm/models.py:88 (TiedLM.__call__) via <site-packages>/flax/linen/linear.py:1184 (Embed.__call__)"),
    (f"{USER} <- {FLAX}", USER),  # the innermost frame is the user's: alone
    (FLAX, "<site-packages>/flax/linen/linear.py:1184 (Embed.__call__)"),  # no user frame at all
    ("/usr/lib/python3/dist-packages/optax/x.py:3 (f) <- " + USER, USER + " via <site-packages>/optax/x.py:3 (f)"),
    ("", "-"),
])
def test_the_users_frame_comes_first(source, want):
    assert source_shown(source) == want


def test_a_library_frame_is_never_shown_in_place_of_the_users():
    """The old rule (innermost frame only) would show Flax's line for the user's embedding."""
    got = source_shown(f"{FLAX} <- {USER}")
    assert got.startswith("/srv/me/lm/models.py:88") and "via" in got
