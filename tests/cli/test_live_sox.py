"""Live classification fed by a real recorder's stream: sox writing a wav (or raw PCM) to a pipe,
as `sox -d -t wav - | wavetrain classify -m m.wt -` does from a microphone. Skipped without sox
(`.ci/run` installs it)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from wavetrain.cli.main import main

pytestmark = pytest.mark.skipif(shutil.which("sox") is None, reason="sox is not installed (apt-get install sox)")
ENV = {**os.environ, "WAVETRAIN_PROGRESS": "0", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def model(demo_csv, tmp_path_factory):
    path = tmp_path_factory.mktemp("sox") / "m.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=2",
                 "-o", str(path)]) == 0
    return path


def _classify_from(sox_args: list[str], model, *extra: str) -> list[str]:
    """Lines printed by ``wavetrain classify -m model - extra`` fed by ``sox sox_args``."""
    sox = subprocess.Popen(["sox", "-n", *sox_args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = subprocess.run([sys.executable, "-m", "wavetrain.cli.main", "classify", "-m", str(model), "-", *extra],
                         stdin=sox.stdout, capture_output=True, text=True, env=ENV, timeout=120)
    assert sox.stdout is not None
    sox.stdout.close()
    sox.wait(timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_a_sox_wav_stream_is_classified_window_by_window(model):
    lines = _classify_from(["-r", "22050", "-b", "16", "-c", "1", "-t", "wav", "-", "synth", "3", "sine", "440"],
                           model, "--clip-ms", "1000")
    assert [ln.split(":")[0] for ln in lines] == ["-[0-1000]", "-[1000-2000]", "-[2000-3000]"]
    assert all(" state=" in ln and "latency_ms=" in ln for ln in lines)


def test_raw_stereo_pcm_from_sox(model):
    lines = _classify_from(["-r", "16000", "-b", "16", "-e", "signed-integer", "-c", "2", "-t", "raw", "-",
                            "synth", "2", "sine", "300"], model,
                           "--rate", "16000", "--channels", "2", "--format", "s16le", "--clip-ms", "500")
    assert len(lines) == 4 and lines[-1].startswith("-[1500-2000]: state=")
