"""A training process killed with SIGKILL resumes from its checkpoint to the same weights.

Every run is a fresh process, as a killed and a resumed ``wavetrain train`` are: torch's float
rounding depends on what else the process has loaded (Intel MKL's FFT and its OpenMP runtime,
loaded before torch, move a cnn's weights by an ulp), so the test process, with whatever earlier
tests loaded, is not a reference. The small case runs in the default suite (a few seconds, most
of it the children's torch imports); the longer one (more steps and validations) is marked slow."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from wavetrain.train.checkpoint import checkpoint_path, load_checkpoint

PARAMS = dict(epochs=4, batch_size=8, frames=10, valid_fraction=0.25, seed=7, valid_every_iters=2)
SMALL = dict(epochs=2, batch_size=6, frames=10, valid_fraction=0.25, seed=7, valid_every_iters=2)

SCRIPT = textwrap.dedent("""
    import os, sys, time
    from wavetrain.models import FitOptions, build
    from wavetrain.train.array_stream import synthetic_stream
    from wavetrain.train.checkpoint import checkpoint_path

    ck, mode = sys.argv[1], sys.argv[4]

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
    stream = synthetic_stream(int(sys.argv[3]), 3, features=12, frames=(6, 12))
    if mode == "killed":             # writes checkpoints and waits to be killed
        build("cnn", params).fit(Slow(stream), options=FitOptions(checkpoint=ck))
    else:                            # uninterrupted, or resumed from the checkpoint: saves its weights
        options = FitOptions(checkpoint=ck, resume=ck) if mode == "resumed" else FitOptions()
        m = build("cnn", params).fit(stream, options=options)
        np.savez(sys.argv[5], iterations=m.train_info_["iterations"], **m.state_dict())
""")


def _child(ck, params, windows: int, mode: str, out=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import numpy as np\n" + SCRIPT, str(ck), repr(params),
                             str(windows), mode, str(out)])


@pytest.mark.parametrize("params, windows", [pytest.param(SMALL, 24, id="small"),
                                             pytest.param(PARAMS, 48, id="longer", marks=pytest.mark.slow)])
def test_sigkill_then_resume(tmp_path, params, windows):
    ck = tmp_path / "ck"
    proc = _child(ck, params, windows, "killed")
    full = _child(tmp_path / "unused", params, windows, "full", tmp_path / "full.npz")   # meanwhile
    try:
        assert full.wait(timeout=300) == 0
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
    done = dict(np.load(tmp_path / "full.npz"))
    it = load_checkpoint(ck)["iteration"]
    assert 0 < it < done["iterations"]
    assert _child(ck, params, windows, "resumed", tmp_path / "resumed.npz").wait(timeout=300) == 0
    resumed = dict(np.load(tmp_path / "resumed.npz"))
    assert resumed.keys() == done.keys() and len(done) > 2
    for k, v in done.items():
        np.testing.assert_array_equal(v, resumed[k], err_msg=k)
