"""A training process killed with SIGKILL resumes from its checkpoint to the same weights."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from wavetrain.models import FitOptions, build
from wavetrain.train import synthetic_stream
from wavetrain.train.checkpoint import checkpoint_path, load_checkpoint

PARAMS = dict(epochs=4, batch_size=8, frames=10, valid_fraction=0.25, seed=7, valid_every_iters=2)

SCRIPT = textwrap.dedent("""
    import sys, time
    from wavetrain.models import FitOptions, build
    from wavetrain.train import synthetic_stream

    class Slow:  # same data, slower reads, so the parent can kill mid-run
        def __init__(self, s):
            self.s, self.labels, self.feature_dim = s, s.labels, s.feature_dim
            self.rate = self.channels = None
        def batches(self, **kw):
            for b in self.s.batches(**kw):
                time.sleep(0.05)
                yield b
        def split_validation(self, *a, **kw):
            t, v = self.s.split_validation(*a, **kw)
            return Slow(t), v

    params = eval(sys.argv[2])
    stream = Slow(synthetic_stream(48, 3, features=12, frames=(6, 12)))
    build("cnn", params).fit(stream, options=FitOptions(checkpoint=sys.argv[1]))
""")


@pytest.mark.slow
def test_sigkill_then_resume(tmp_path):
    ck = tmp_path / "ck"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(ck), repr(PARAMS)])
    try:
        deadline = time.monotonic() + 120
        while not checkpoint_path(ck).exists():
            assert proc.poll() is None, "training ended before writing a checkpoint"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    it = load_checkpoint(ck)["iteration"]
    stream = synthetic_stream(48, 3, features=12, frames=(6, 12))
    full = build("cnn", PARAMS).fit(stream)
    assert it < full.train_info_["iterations"]
    resumed = build("cnn", PARAMS).fit(stream, options=FitOptions(checkpoint=str(ck), resume=str(ck)))
    for k, v in full.state_dict().items():
        np.testing.assert_array_equal(v, resumed.state_dict()[k], err_msg=k)
