"""The collector leaves loaded objects alone, and a retired model's cyclic garbage is still reclaimed."""

import gc
import weakref

import pytest

from gateway.repository.heap import collect_retired, freeze_loaded


@pytest.fixture(autouse=True)
def _thaw():
    yield
    gc.unfreeze()


class _Node:
    pass


def test_freeze_takes_existing_objects_out_of_collection():
    gc.unfreeze()
    freeze_loaded()
    assert gc.get_freeze_count() > 1000  # the interpreter, pytest and everything imported so far


def test_collect_retired_reclaims_cycles_that_were_frozen():
    node = _Node()
    node.self = node  # a cycle: only the collector can free it
    alive = weakref.ref(node)
    freeze_loaded()
    del node
    gc.collect()
    assert alive() is not None, "frozen objects are not collected"
    collect_retired()
    assert alive() is None
    assert gc.get_freeze_count() > 0  # the survivors are frozen again
