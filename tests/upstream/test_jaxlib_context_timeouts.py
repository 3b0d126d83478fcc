"""The jaxlib build's commands are bounded by --command-timeout: a hung command's whole process group
is killed (xla_harness.upstream.jaxlib_context's Runner), and the flag is checked. The planted
child and grandchild are those of tests/runtime/test_subproc.py."""

from __future__ import annotations

import pytest

from xla_harness.errors import HarnessError

from ..helpers import grandchild_pid, planted_child, process_gone


@pytest.mark.slow
def test_the_jaxlib_stage_runner_kills_a_hung_command_and_names_it(tmp_path):
    """The build pipeline's commands (hours of bazel) are bounded by --command-timeout: with check
    a timeout is one error naming the stage and command; without (the test stage) it is exit 124."""
    from xla_harness.upstream.jaxlib_context import TIMED_OUT, Ctx, Runner

    ctx = Ctx(work=tmp_path / "work", jax_version="0.12.0.1", command_timeout_s=1.0)
    pidfile = tmp_path / "grandchild.pid"
    with pytest.raises(HarnessError) as caught:
        Runner(ctx)(planted_child(pidfile, False), tmp_path, "build", what="jax build/build.py")
    message = str(caught.value)
    assert message.startswith("build: jax build/build.py did not finish in 1 s (its process group was killed)")
    assert "--command-timeout" in message and str(ctx.log("build")) in message
    assert process_gone(grandchild_pid(pidfile))
    pidfile.unlink()
    assert Runner(ctx)(planted_child(pidfile, False), tmp_path, "test", what="bazel test", check=False) == TIMED_OUT
    assert process_gone(grandchild_pid(pidfile))
    assert "did not finish in 1 s" in ctx.log("test").read_text()


@pytest.mark.parametrize("bad", ["0", "-5", "nan", "inf"])
def test_command_timeout_flag_is_checked(tmp_path, capsys, bad):
    from xla_harness.upstream.jaxlib_build import main

    assert main(["--dry-run", "--work-dir", str(tmp_path / "w"), "--command-timeout", bad]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --command-timeout must be a positive number"), lines
