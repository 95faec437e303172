"""Root conftest: the shared fixtures (real nats-server, service subprocesses) for every test tree."""
pytest_plugins = ["agmarl_testing.fixtures"]
