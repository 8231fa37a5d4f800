pytest_plugins = ["engram_testing.fixtures"]
