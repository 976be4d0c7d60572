"""The fast tier holds no live-server test: the collection hook refuses one not marked slow."""

from __future__ import annotations

import pytest

from tests.conftest import pytest_collection_modifyitems


class FakeItem:
    def __init__(self, nodeid: str, fixturenames: tuple[str, ...], slow: bool):
        self.nodeid, self.fixturenames, self.slow = nodeid, fixturenames, slow

    def get_closest_marker(self, name: str):
        return object() if name == "slow" and self.slow else None


def test_an_unmarked_live_server_test_is_refused():
    items = [FakeItem("a::live", ("tmp_path", "idle_server", "server"), slow=False)]
    with pytest.raises(pytest.UsageError, match="a::live"):
        pytest_collection_modifyitems(None, items)


def test_marked_live_tests_and_unit_tests_pass():
    items = [
        FakeItem("a::live", ("start_server",), slow=True),
        FakeItem("b::unit", ("tmp_path",), slow=False),
    ]
    pytest_collection_modifyitems(None, items)
