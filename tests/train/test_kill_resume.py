"""A training process killed with SIGKILL resumes from its checkpoint to the same weights.

The small case runs in the default suite (a few seconds, most of it the child's torch import);
the longer one (more steps and validations) is marked slow."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from wavetrain.models import FitOptions, build
from wavetrain.train.array_stream import synthetic_stream
from wavetrain.train.checkpoint import checkpoint_path, load_checkpoint

PARAMS = dict(epochs=4, batch_size=8, frames=10, valid_fraction=0.25, seed=7, valid_every_iters=2)
SMALL = dict(epochs=2, batch_size=6, frames=10, valid_fraction=0.25, seed=7, valid_every_iters=2)

SCRIPT = textwrap.dedent("""
    import os, sys, time
    from wavetrain.models import FitOptions, build
    from wavetrain.train.array_stream import synthetic_stream
    from wavetrain.train.checkpoint import checkpoint_path

    ck = sys.argv[1]

    class Slow:  # same data, slower reads; once a checkpoint exists, it waits to be killed (30 s a read)
        def __init__(self, s):
            self.s, self.labels, self.feature_dim = s, s.labels, s.feature_dim
            self.rate = self.channels = None
        def batches(self, **kw):
            for b in self.s.batches(**kw):
                time.sleep(30 if checkpoint_path(ck).exists() else 0.05)
                yield b
        def split_validation(self, *a, **kw):
            t, v = self.s.split_validation(*a, **kw)
            return Slow(t), v

    params = eval(sys.argv[2])
    stream = Slow(synthetic_stream(int(sys.argv[3]), 3, features=12, frames=(6, 12)))
    build("cnn", params).fit(stream, options=FitOptions(checkpoint=ck))
""")


@pytest.mark.parametrize("params, windows", [pytest.param(SMALL, 24, id="small"),
                                             pytest.param(PARAMS, 48, id="longer", marks=pytest.mark.slow)])
def test_sigkill_then_resume(tmp_path, params, windows):
    ck = tmp_path / "ck"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(ck), repr(params), str(windows)])
    try:
        stream = synthetic_stream(windows, 3, features=12, frames=(6, 12))
        full = build("cnn", params).fit(stream)                 # the uninterrupted run, while the child starts
        deadline = time.monotonic() + 120
        while not checkpoint_path(ck).exists():
            assert proc.poll() is None, "training ended before writing a checkpoint"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    it = load_checkpoint(ck)["iteration"]
    assert 0 < it < full.train_info_["iterations"]
    resumed = build("cnn", params).fit(stream, options=FitOptions(checkpoint=str(ck), resume=str(ck)))
    assert resumed.train_info_["iterations"] == full.train_info_["iterations"]
    for k, v in full.state_dict().items():
        np.testing.assert_array_equal(v, resumed.state_dict()[k], err_msg=k)
