"""Ctrl-C during a Spark job: the jobs are cancelled (no py4j tracebacks from a call cut in the
middle), the run ends with KeyboardInterrupt (the CLI: one line, exit 130), and the temporary
files of its tasks are swept."""
import glob
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from wavetrain.spark.session import SparkSettings, interrupted, spark_session


@pytest.fixture(scope="module")
def sc():
    with spark_session(SparkSettings("local[2]")) as session:
        yield session.sparkContext


def _interrupt_when_running(sc, tries=600):
    """From another thread: SIGINT to this process once a job runs (checked every 0.1 s, bounded)."""
    def send():
        for _ in range(tries):
            if sc.statusTracker().getActiveJobsIds():
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.1)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_during_a_job_cancels_it_and_ends_the_session_with_keyboard_interrupt(sc, tmp_path, caplog):
    marks = str(tmp_path)

    def task(i):
        time.sleep(60)                                   # only a cancelled job ends before this
        with open(os.path.join(marks, f"finished-{i}-{uuid.uuid4().hex}"), "w"):
            pass
        return i

    handler = signal.getsignal(signal.SIGINT)
    sender = _interrupt_when_running(sc)
    with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt), \
            spark_session(SparkSettings("local[2]")) as spark:
        spark.sparkContext.parallelize(range(2), 2).map(task).collect()
    sender.join(timeout=5)
    assert signal.getsignal(signal.SIGINT) is handler and not interrupted()
    assert not glob.glob(os.path.join(marks, "finished-*"))
    noise = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not noise, [r.getMessage() for r in noise]          # py4j's "Exception while sending command"
    assert sc.parallelize(range(3), 2).sum() == 3                # the context outlives a joined session's interrupt


def test_ctrl_c_outside_a_call_to_the_jvm_interrupts_at_once(sc):
    with pytest.raises(KeyboardInterrupt), spark_session(SparkSettings("local[2]")):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(600):                             # the handler raises in this loop
            time.sleep(0.1)


@pytest.mark.slow
def test_ctrl_c_on_the_command_line_is_one_line_exit_130_and_leaves_no_temporary_file(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: the driver, the JVM, the workers."""
    from wavetrain.data.demo import make_demo_dataset

    data = make_demo_dataset(tmp_path / "data", per_combo=4, speeds=(15.0, 30.0), snrs=(10.0, 20.0), seconds=30.0)
    table = tmp_path / "table"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, "-m", "wavetrain.cli.main", "features", "--data", str(data), "--spec",
                          "mfcc(coeffs=13)", "-o", str(table), "--engine", "spark", "--master", "local[2]",
                          "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env=env)
    try:
        for _ in range(3000):                            # a task is writing a part (at most 5 minutes)
            if glob.glob(f"{table}/spec=*/.tmp-*.parquet") or p.poll() is not None:
                break
            time.sleep(0.1)
        assert p.poll() is None, "the job ended before it could be interrupted"
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    lines = [ln for ln in err.splitlines() if ln.startswith("wavetrain") or "Traceback" in ln or "ERROR" in ln]
    assert p.returncode == 130 and lines == ["wavetrain: interrupted"], err
    assert not glob.glob(f"{table}/**/.tmp-*", recursive=True)
    assert not glob.glob(f"{table}/_scratch/*")
