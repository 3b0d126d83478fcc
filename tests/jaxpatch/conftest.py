def pytest_configure(config):
    config.addinivalue_line("markers", "slow: subprocess end-to-end test")
