import os

# Eight host-platform devices for the sharded tests; must be set before jax is imported.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

pytest_plugins = ["pytester"]


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end tests that run subprocesses (part of make test)")
