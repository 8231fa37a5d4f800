pytest_plugins = ["engram_testing.fixtures", "engram_testing.browser"]
