import numpy as np
import pytest

from wavetrain.core.errors import ParameterError
from wavetrain.stream.windows import Windowing


def test_whole_recording_is_one_window():
    assert Windowing().spans(57, 0.01) == [(0, 57)]


def test_back_to_back_and_sliding_clips():
    w = Windowing(clip_ms=100, shift_ms=0, pad="none")
    assert w.spans(35, 0.01) == [(0, 10), (10, 20), (20, 30)]
    w = Windowing(clip_ms=100, shift_ms=50, pad="none")
    assert w.spans(30, 0.01) == [(0, 10), (5, 15), (10, 20), (15, 25), (20, 30)]


def test_padding_modes():
    g = np.arange(12, dtype=np.float32).reshape(6, 2)
    zero = Windowing(clip_ms=40, pad="zero")
    spans = zero.spans(6, 0.01)
    assert spans == [(0, 4), (4, 8)]
    last = zero.cut(g, spans[1], silence=np.full(2, -1, np.float32))
    np.testing.assert_array_equal(last, [[8, 9], [10, 11], [-1, -1], [-1, -1]])
    dup = Windowing(clip_ms=40, pad="duplicate")
    np.testing.assert_array_equal(dup.cut(g, (4, 8)), [[8, 9], [10, 11], [0, 1], [2, 3]])
    assert Windowing(clip_ms=100, pad="none").spans(6, 0.01) == []
    assert Windowing(clip_ms=100, pad="duplicate").cut(g, (0, 10)).shape == (10, 2)


def test_full_clips_are_views():
    g = np.zeros((20, 3), np.float32)
    w = Windowing(clip_ms=50)
    assert np.shares_memory(w.cut(g, (0, 5)), g)


def test_bad_settings():
    with pytest.raises(ParameterError):
        Windowing(clip_ms=-1)
    with pytest.raises(ParameterError):
        Windowing(pad="mirror")
