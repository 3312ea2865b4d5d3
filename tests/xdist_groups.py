"""`--dist loadgroup` on pytest 9.2: the `xdist_group` marks group tests again.

What flows: each collected test's `xdist_group` marks, in; its node id with the `@group`
suffix that pytest-xdist's loadgroup scheduler reads, out. Owned by the test suite (loaded
by tests/conftest.py), needed until pytest-xdist writes pytest 9.2's node ids itself.

pytest-xdist 3.8 appends the suffix by assigning `item._nodeid`, which pytest 9.2 no longer
reads (its node id is the structured `item._id`), so every group was silently spread over
both workers (pytest-dev/pytest-xdist#1386, fix pending in #1388): Ray's local clusters
raced for their ports, and a module's `surge serve` fixture started once per worker."""

import pytest


def _groups(item: pytest.Item) -> list[str]:
    """The item's group names, as pytest-xdist names them (`name=` or the first argument)."""
    names = {
        str(m.args[0] if m.args else m.kwargs.get("name", "default"))
        for m in item.iter_markers("xdist_group")
    }
    return sorted(names)


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook, which may fix it one day
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set on the workers of loadgroup
        return
    for item in items:
        groups = _groups(item)
        # xdist's scheduler takes what follows the last "@" after any "]" as the group.
        tail = item.nodeid[item.nodeid.rfind("]") + 1 :]
        if not groups or "@" in tail:
            continue
        node_id = getattr(item, "_id", None)
        if node_id is None:  # an older pytest: xdist's own suffix took effect
            continue
        item._id = type(node_id).parse(f"{item.nodeid}@{'_'.join(groups)}")
