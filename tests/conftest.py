import contextlib
import os

# The suite runs on the CPU: with libtpu or the CUDA plugin installed (make setup-targets), jax would
# otherwise try to open a TPU or GPU at import (and print libtpu's warnings on every subprocess).
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Eight host-platform devices for the sharded tests; must be set before jax is imported.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

pytest_plugins = ["pytester"]

# A test that starts a subprocess must carry @pytest.mark.slow (tests/subprocess_guard.py).
pytest_plugins += ["tests.subprocess_guard"]


def pytest_sessionstart(session):
    """Stress runs record this project's commit, asked of git once per process: asked here,
    outside any test, so a fast test that writes results starts no subprocess of its own."""
    from xla_harness.stress.results.provenance import repo_commit

    repo_commit()
    # matplotlib builds its font cache on first use, asking fontconfig (`fc-list`) in a subprocess:
    # on a fresh machine that would happen inside whichever fast test plots first. Built here, once.
    with contextlib.suppress(ImportError):  # without the plot extra no test plots
        import matplotlib.font_manager  # noqa: F401 - importing it builds (or loads) the cache
