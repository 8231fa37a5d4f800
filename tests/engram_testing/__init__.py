"""Test support shared by every test directory (importable via pytest's pythonpath)."""
