"""A pytest plugin (``-p``) for the tests part's child: the tests that compile a model with Inductor (their ids
name ``compiled``; tens of seconds each on a cold GPU) run after every other, so that a suite stopped at the
part's limit has run the most tests first. The rest keep their order."""
from __future__ import annotations


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: "compiled" in item.nodeid)  # stable: False first
