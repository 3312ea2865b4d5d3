"""The live-server fixtures of tests/control (a SURGE_HOME with the default tiny store)."""

from tests.control.conftest import surge_home, tiny_store_dir

__all__ = ["surge_home", "tiny_store_dir"]
