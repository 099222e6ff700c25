"""Integration fixtures: one real multi-process cluster per test module."""

from __future__ import annotations

import pytest
from harness import Cluster, launch


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration_tests" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    c = launch(tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        c.stop()
