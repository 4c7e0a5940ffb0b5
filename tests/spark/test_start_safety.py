"""A Spark session that cannot start, or is interrupted while it starts: one line (exit 2, or
``wavetrain: interrupted`` and 130), never a py4j traceback, and nothing of it left behind (no JVM,
no Spark temporary folder). A master URL Spark would refuse and a ``spark://`` master that takes
no connection are refused before any JVM starts."""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from wavetrain.cli.main import main
from wavetrain.core.errors import ParameterError, UserError
from wavetrain.spark import session
from wavetrain.spark.session import MASTER_ENV, SparkSettings, check_master, check_master_reachable, spark_session

#: Seconds a command of these tests may take at most (a JVM starts in 5-15 s).
RUN_S = 240


def _free_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _SilentMaster:
    """A TCP server on 127.0.0.1 that takes connections and never answers (not a Spark master);
    ``times`` holds when each connection came (bounded: 64)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"spark://127.0.0.1:{self.sock.getsockname()[1]}"
        self.times: list[float] = []
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        for _ in range(64):
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._held.append(conn)
            self.times.append(time.monotonic())

    def close(self):
        self.sock.close()
        for c in self._held:
            c.close()


# -- master URLs, without a JVM ------------------------------------------------------------------

@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[2,4]", "local[*, 3]",
                                    "local-cluster[2, 1, 1024]", "spark://head:7077", "spark://h1:7077,h2:7077",
                                    "spark://[::1]:7077", "spark://10.0.0.1:7077", "yarn", "k8s://https://h:6443"])
def test_master_urls_spark_takes_are_taken(master):
    check_master(master)
    assert SparkSettings(master).master == master


@pytest.mark.parametrize("master, message", [
    ("foo", "expected local, local[N]"),
    ("local[x]", "expected local, local[N]"),
    ("local[0]", "expected local, local[N]"),
    ("local-cluster[2,1]", "expected local, local[N]"),
    ("yarn-client", "expected local, local[N]"),
    ("spark:/head:7077", "expected local, local[N]"),
    ("spark://", "'nothing' is not HOST:PORT"),
    ("spark://127.0.0.1", "'127.0.0.1' is not HOST:PORT"),
    ("spark://head:0", "'head:0' is not HOST:PORT"),
    ("spark://head:70000", "'head:70000' is not HOST:PORT"),
    ("spark://head:7077/path", "is not HOST:PORT"),
    ("spark://h1:7077,", "'nothing' is not HOST:PORT"),
    ("spark://under_score:7077", "is not HOST:PORT"),
])
def test_a_master_url_spark_would_refuse_is_one_line_before_any_jvm(master, message):
    with pytest.raises(ParameterError, match=re.escape(message)) as e:
        SparkSettings(master)
    assert str(e.value).startswith(f"--master {master!r}: ") and "\n" not in str(e.value)


def test_a_malformed_master_from_the_environment_is_named_as_such(monkeypatch):
    monkeypatch.setenv(MASTER_ENV, "spark://head")
    with pytest.raises(ParameterError, match=rf"^\${MASTER_ENV} 'spark://head': 'head' is not HOST:PORT"):
        SparkSettings()


def test_a_spark_master_that_takes_no_connection_is_refused_naming_why(monkeypatch):
    port = _free_port()
    with pytest.raises(UserError, match=rf"cannot reach the Spark master spark://127.0.0.1:{port} "
                                        rf"\(127.0.0.1:{port}: connection refused\): start it"):
        check_master_reachable(f"spark://127.0.0.1:{port}")
    with pytest.raises(UserError, match=r"nosuch.invalid:7077: unknown host"):
        check_master_reachable("spark://nosuch.invalid:7077")
    with pytest.raises(UserError, match=r"\(127.0.0.1:\d+: connection refused; nosuch.invalid:7077: unknown host\)"):
        check_master_reachable(f"spark://127.0.0.1:{port},nosuch.invalid:7077")
    silent = _SilentMaster()
    try:
        check_master_reachable(silent.url)                              # something listens: Spark decides
        check_master_reachable(f"spark://127.0.0.1:{port},{silent.url[len('spark://'):]}")   # one of two masters
    finally:
        silent.close()
    check_master_reachable("local[2]")


def test_an_unreachable_master_is_refused_before_the_jvm_starts(demo_csv, tmp_path, capsys, monkeypatch):
    from pyspark import SparkContext

    def no_jvm(*a, **k):
        raise AssertionError("a Spark context was started for an unreachable master")

    monkeypatch.setattr(SparkContext, "getOrCreate", no_jvm)
    monkeypatch.setattr(session, "check_java", lambda: "java")       # (nor is Java needed for this)
    code = main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "-o", str(tmp_path / "m.wt"),
                 "--engine", "spark", "--master", f"spark://127.0.0.1:{_free_port()}"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "cannot reach the Spark master" in err, err
    assert not (tmp_path / "m.wt").exists()


# -- the command line, in a process of its own ---------------------------------------------------

def _is_spark(proc: psutil.Process) -> bool:
    """Whether ``proc`` runs Spark (its launcher or its JVM; not ``java -version``)."""
    try:
        return any(arg.startswith("org.apache.spark") for arg in proc.cmdline())
    except psutil.Error:
        return False


class _Run:
    """``wavetrain ARGS`` in a new session (process group), its working folder ``tmp/run`` and its
    temporary folder ``tmp/tmp`` (Spark's local folder too); every Spark Java process it ever had
    is recorded (polled every 50 ms), to check none is left."""

    def __init__(self, tmp_path, *args: str):
        self.cwd = tmp_path / "run"
        self.tmp = tmp_path / "tmp"
        self.cwd.mkdir(parents=True)
        self.tmp.mkdir()
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   TMPDIR=str(self.tmp))
        self.p = subprocess.Popen([sys.executable, "-m", "wavetrain.cli.main", *args,
                                   "--spark-conf", f"spark.local.dir={self.tmp}"],
                                  cwd=self.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        self.java: dict[int, psutil.Process] = {}
        self.first_java: float | None = None         # time.monotonic() when a Java process was first seen

    def poll_java(self) -> bool:
        """Record the Java processes under the command; whether it still runs."""
        try:
            for child in psutil.Process(self.p.pid).children(recursive=True):
                if child.pid not in self.java and "java" in child.name() and _is_spark(child):
                    self.java[child.pid] = child
                    self.first_java = self.first_java or time.monotonic()
        except psutil.Error:
            pass
        return self.p.poll() is None

    def wait_for(self, condition, what: str) -> None:
        """Poll until ``condition()`` (at most :data:`RUN_S` seconds); fail if the command ended first."""
        deadline = time.monotonic() + RUN_S
        while self.poll_java() and time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.05)
        raise AssertionError(f"the command ended (or took too long) before {what}: {self.finish()}")

    def finish(self):
        """Wait for the command (at most :data:`RUN_S` s); its exit code and standard error's lines."""
        reader = threading.Thread(target=self._poll_while_running, daemon=True)
        reader.start()
        try:
            _, err = self.p.communicate(timeout=RUN_S)
        finally:
            if self.p.poll() is None:
                os.killpg(self.p.pid, signal.SIGKILL)
        reader.join()
        return self.p.returncode, [ln for ln in err.splitlines() if ln.strip()]

    def _poll_while_running(self):
        while self.poll_java():
            time.sleep(0.05)

    def leftovers(self) -> list[str]:
        """Java processes of the command still there (it has ended), and Spark's temporary folders
        and pyspark's left in its temporary folder."""
        alive = []
        for pid, proc in self.java.items():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"java {pid}: {' '.join(proc.cmdline())[-80:]}")
            except psutil.Error:
                pass
        # a JVM the command never saw (one that started between two polls) still works in its folder
        for proc in psutil.process_iter(["name", "cwd"]):
            if (proc.info["cwd"] == str(self.cwd) and "java" in (proc.info["name"] or "") and proc.pid not in self.java
                    and _is_spark(proc)):
                alive.append(f"java {proc.pid} (unseen)")
        stray = sorted(p.name for p in self.tmp.iterdir() if not p.name.startswith("wavetrain-log4j2-"))
        return alive + stray

    def kill_everything(self):
        """After a failure: end what the command left (its processes only)."""
        for proc in self.java.values():
            try:
                proc.kill()
            except psutil.Error:
                pass


@pytest.fixture
def command(tmp_path):
    runs = []

    def start(*args):
        run = _Run(tmp_path / f"c{len(runs)}", *map(str, args))
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.p.poll() is None:
            os.killpg(run.p.pid, signal.SIGKILL)
        run.kill_everything()


def _train(demo_csv, tmp_path, *extra):
    return ("train", "--data", demo_csv, "--label", "state", "--model", "gmm", "-o", tmp_path / "m.wt",
            "--table", tmp_path / "table", "--engine", "spark", "--no-progress", *extra)


def test_the_unreachable_master_of_the_command_line_is_one_line(demo_csv, tmp_path, command):
    run = command(*_train(demo_csv, tmp_path, "--master", "spark://127.0.0.1:1"))
    code, lines = run.finish()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("wavetrain: error: cannot reach the Spark master spark://127.0.0.1:1 "
                               "(127.0.0.1:1: connection refused)"), lines
    assert not run.java and not run.leftovers()                         # no JVM was started


@pytest.mark.parametrize("setting, message", [
    # a Java exception as the context starts (Py4JJavaError)
    ("spark.memory.fraction=7", "could not start Spark with master 'local[2]': spark.memory.fraction should be "
                                "between 0 and 1 (was '7.0')."),
    # the JVM exits before its gateway answers
    ("spark.driver.memory=1x", "could not start Spark with master 'local[2]': Java exited as it started: "
                               "Invalid maximum heap size: -Xmx1x"),
])
def test_a_setting_spark_refuses_as_it_starts_is_one_line_and_leaves_nothing(demo_csv, tmp_path, command, setting,
                                                                             message):
    run = command(*_train(demo_csv, tmp_path, "--master", "local[2]", "--spark-conf", setting))
    code, lines = run.finish()
    assert code == 2 and lines == [f"wavetrain: error: {message}"], lines
    assert run.java and not run.leftovers()


def _spark_folders(folder):
    return [p for p in folder.iterdir() if p.name.startswith(("spark-", "blockmgr-"))]


@pytest.mark.parametrize("moment", ["java starts", "context starts",
                                    pytest.param("master registers", marks=pytest.mark.slow)])   # ~20 s: the grace
def test_ctrl_c_while_the_session_starts_is_one_line_exit_130_and_leaves_nothing(demo_csv, tmp_path, command,
                                                                                moment):
    """A terminal's Ctrl-C reaches the whole process group: the driver, spark-submit, the JVM.
    ``java starts``: as soon as a Java process runs (the driver waits for its gateway);
    ``context starts``: once Spark's folders appear (the driver waits inside a call to the JVM);
    ``master registers``: once the JVM connected to a master that never answers."""
    silent = _SilentMaster() if moment == "master registers" else None
    try:
        master = silent.url if silent else "local[2]"
        run = command(*_train(demo_csv, tmp_path, "--master", master))
        if moment == "java starts":
            run.wait_for(lambda: run.java, "a Java process started")
        elif moment == "context starts":
            run.wait_for(lambda: _spark_folders(run.tmp), "Spark made its folders")
        else:
            # (the driver's own check connects before any JVM starts)
            run.wait_for(lambda: run.first_java is not None and any(t > run.first_java for t in silent.times),
                         "the JVM connected to the master")
        os.killpg(run.p.pid, signal.SIGINT)
        code, lines = run.finish()
    finally:
        if silent:
            silent.close()
    assert code == 130 and lines == ["wavetrain: interrupted"], lines
    assert not run.leftovers()


@pytest.mark.slow
def test_a_listening_port_that_is_no_master_is_one_line_after_sparks_own_wait(demo_csv, tmp_path, command):
    """Spark tries a master that takes connections for about a minute (three 20 s attempts, fixed
    in Spark); then one line, not Spark's stack trace."""
    silent = _SilentMaster()
    try:
        run = command(*_train(demo_csv, tmp_path, "--master", silent.url))
        code, lines = run.finish()
    finally:
        silent.close()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"wavetrain: error: the Spark master {silent.url} did not take this application "
                               "(All masters are unresponsive! Giving up.)"), lines
    assert not run.leftovers()


# -- the Python API, in this process ------------------------------------------------------------

def test_a_failed_start_in_this_process_leaves_spark_usable(tmp_path):
    """Whether this process launched the JVM (it is then ended) or one is still up from an earlier
    session (it is kept), a start that fails is one UserError and the next session starts."""
    from pyspark.sql import SparkSession

    assert SparkSession.getActiveSession() is None
    bad = SparkSettings("local[2]", {"spark.memory.fraction": "7", "spark.local.dir": str(tmp_path)})
    with pytest.raises(UserError, match=r"^could not start Spark with master 'local\[2\]': spark.memory.fraction "
                                        r"should be between 0 and 1") as e, spark_session(bad):
        pass
    assert "\n" not in str(e.value) and not _spark_folders(tmp_path)
    with spark_session(SparkSettings("local[2]")) as spark:
        assert spark.sparkContext.parallelize(range(4), 2).sum() == 6
