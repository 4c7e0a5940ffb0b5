"""The examples in the store docstrings run."""
from __future__ import annotations

import doctest

import pytest

import wavetrain.store._format
import wavetrain.store.feature_store
import wavetrain.store.memory_cache


@pytest.mark.parametrize("module", [wavetrain.store._format, wavetrain.store.feature_store,
                                    wavetrain.store.memory_cache])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0
