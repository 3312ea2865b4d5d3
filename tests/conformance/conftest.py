"""The live-server fixtures of tests/control, shared here."""

from tests.control.conftest import surge_home, tiny_store_dir  # noqa: F401
