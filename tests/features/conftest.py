import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def tone(freq, rate, seconds=1.0, amp=0.5):
    t = np.arange(int(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)
