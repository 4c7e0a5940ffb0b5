"""When progress bars show: --progress forces them also into a file or a pipe."""
import io
import subprocess
import sys

import pytest

from wavetrain.core.progress import progress_counter, progress_enabled


@pytest.mark.parametrize("env, flag, shown", [
    (None, True, True), (None, False, False), (None, None, False),   # stderr is not a terminal here
    ("1", None, True), ("1", False, False), ("0", True, False),
])
def test_flag_and_environment(monkeypatch, env, flag, shown):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    if env is None:
        monkeypatch.delenv("WAVETRAIN_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("WAVETRAIN_PROGRESS", env)
    assert progress_enabled(flag) is shown
    bar = progress_counter(desc="x", total=3, enable=flag)
    assert (bar is not None) is shown
    if bar is not None:
        bar.update(3)
        bar.close()
        assert "0/3" in sys.stderr.getvalue()


def test_cli_progress_reaches_a_redirected_stderr(demo_csv, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "wavetrain.cli.main", "train", "--data", str(demo_csv), "--label", "state",
           "--model", "gmm", "--no-cache", "-o", str(tmp_path / "m.wt")]
    shown = subprocess.run(cmd + ["--progress"], env=env, capture_output=True, text=True, timeout=300)
    quiet = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0 and quiet.returncode == 0, shown.stderr + quiet.stderr
    assert "gmm EM" in shown.stderr and "gmm EM" not in quiet.stderr
