"""The process's resources (runtime/process.py): what is held when the controller has primed
its cache is left out of later garbage collections."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from jobset_inplace.runtime.process import freeze_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the other tests' collections as before


def test_what_the_process_holds_is_left_out_of_later_collections(unfrozen: None) -> None:
    held = [[i] for i in range(1000)]  # (a dict of atoms only is not tracked at all)
    assert any(o is held[0] for o in gc.get_objects()), "tracked before"
    freeze_heap("test")
    assert gc.get_freeze_count() >= len(held)
    assert not any(o is held[0] for o in gc.get_objects()), "not looked at by a collection"
    made_after = [held]
    assert any(o is made_after for o in gc.get_objects()), "what comes later is collected"
