pytest_plugins = ["fixtures.services"]
