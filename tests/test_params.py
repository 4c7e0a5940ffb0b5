"""The one parameter system: values in every form a user writes them, one message form."""
import numpy as np
import pytest

from wavetrain.core.errors import ParameterError
from wavetrain.core.params import Param


@pytest.mark.parametrize("p,given,expected", [
    (Param("n", 8, "", int, low=1, high=1024), "16", 16),
    (Param("n", 8, "", int, low=1, high=1024), 16.0, 16),
    (Param("n", 8, "", int, low=1, high=1024), np.int64(16), 16),
    (Param("x", 1.0, "", float, low=0), "2.5", 2.5),
    (Param("x", 1.0, "", float, low=0), np.float32(0.5), 0.5),
    (Param("b", False, "", bool), "yes", True),
    (Param("b", False, "", bool), 0, False),
    (Param("b", False, "", bool), np.bool_(True), True),
    (Param("s", "hann", "", str, choices=("hann", "hamming")), "HANN", "hann"),
    (Param("f", 512, "", int, low=1, choices=("fast", "pow2"), optional=True), "FAST", "fast"),
    (Param("f", 512, "", int, low=1, choices=("fast", "pow2"), optional=True), "none", None),
    (Param("t", "x", "", str), "  text ", "text"),
])
def test_values_in_every_form(p, given, expected):
    out = p.coerce(given, "m")
    assert out == expected and type(out) is type(expected)


@pytest.mark.parametrize("p,given,message", [
    (Param("n", 8, "", int, low=1, high=1024), 0, "m.n: expected an integer in [1, 1024], got 0"),
    (Param("n", 8, "", int, low=1, high=1024), "abc", "m.n: expected an integer in [1, 1024], got 'abc'"),
    (Param("n", 8, "", int, low=1), 1.5, "m.n: expected an integer >= 1, got 1.5"),
    (Param("x", 1.0, "", float, low=0, low_open=True, high=100), 0, "m.x: expected a number in (0, 100], got 0"),
    (Param("x", 1.0, "", float), float("nan"), "m.x: expected a number, got nan"),
    (Param("b", False, "", bool), "maybe", "m.b: expected true or false, got 'maybe'"),
    (Param("s", "a", "", str, choices=("a", "b")), "c", "m.s: expected one of a, b, got 'c'"),
    (Param("n", 8, "", int, low=1), None, "m.n: expected an integer >= 1, got none"),
])
def test_one_message_form(p, given, message):
    with pytest.raises(ParameterError) as info:
        p.coerce(given, "m")
    assert str(info.value) == message and info.value.param == p.name
