"""Spark settings, the Java check and the session the engine's jobs run in.

:func:`spark_session` starts (or joins) a session for :class:`SparkSettings`: the master
(``--master``, else ``$WAVETRAIN_SPARK_MASTER``, else ``local[*]``), wavetrain's defaults
(:data:`DEFAULT_CONF`) and the user's ``--spark-conf key=value`` settings, which win. pyspark and
Java are checked first, each with a one-line error that says what to install.

Ctrl-C during a session cancels its jobs (:class:`Interrupt`): the driver's call waiting on a job
is never cut in the middle of a message to the JVM (that prints py4j's tracebacks), the job fails
as cancelled, and the session ends with :class:`KeyboardInterrupt` (``wavetrain: interrupted``,
exit code 130).
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.outputs import OutputError, write_atomic

__all__ = ["DEFAULT_CONF", "MASTER_ENV", "Interrupt", "SparkSettings", "check_java", "check_pyspark", "interrupted",
           "spark_session"]

MASTER_ENV = "WAVETRAIN_SPARK_MASTER"
#: What wavetrain sets unless ``--spark-conf`` says otherwise. Executors run one compute thread
#: per task (two BLAS threads on one core are many times slower than one); a barrier stage that
#: cannot get its slots fails in seconds instead of waiting ten minutes.
DEFAULT_CONF = {
    "spark.app.name": "wavetrain",
    "spark.driver.memory": "1g",
    "spark.executor.memory": "1g",
    "spark.python.worker.memory": "256m",
    "spark.ui.showConsoleProgress": "false",
    "spark.executorEnv.OMP_NUM_THREADS": "1",
    "spark.executorEnv.OPENBLAS_NUM_THREADS": "1",
    "spark.executorEnv.MKL_NUM_THREADS": "1",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
}
#: Added for masters on this machine: nothing listens beyond 127.0.0.1, no web UI.
LOCAL_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
}
MIN_JAVA = 17


@dataclass
class SparkSettings:
    """Where and how Spark jobs run.

    Attributes
    ----------
    master : str
        ``local[*]``, ``local[N]``, ``spark://host:port``, ``yarn``, ``k8s://...``.
    conf : dict
        Spark settings given by the user (``--spark-conf``); they override :data:`DEFAULT_CONF`.
    """

    master: str = ""
    conf: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # under spark-submit (its JVM is already up) the master is spark-submit's: "" keeps it
        default = "" if os.environ.get("PYSPARK_GATEWAY_PORT") else "local[*]"
        self.master = (self.master or os.environ.get(MASTER_ENV) or default).strip()

    @classmethod
    def from_args(cls, master: str | None, items: list[str] | None) -> SparkSettings:
        """``--master`` and the ``--spark-conf key=value`` items of the command line."""
        conf = {}
        for it in items or []:
            key, sep, value = it.partition("=")
            if not sep or not key.strip() or not key.strip().startswith("spark."):
                raise ParameterError(f"--spark-conf {it!r}: expected spark.KEY=VALUE (e.g. "
                                     "--spark-conf spark.executor.memory=2g)")
            conf[key.strip()] = value.strip()
        return cls(master or "", conf)

    @property
    def is_local(self) -> bool:
        """Whether every process runs on this machine (``local[...]`` or a master on 127.0.0.1)."""
        return self.master.startswith("local") or "://127.0.0.1:" in self.master or "://localhost:" in self.master

    def cores(self) -> int:
        """Task slots the master gives (``local[N]``, ``local[*]``, else ``spark.cores.max`` or 2),
        without starting Spark."""
        m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", self.master)
        if m:
            return os.cpu_count() or 1 if m[1] in (None, "*") else int(m[1])
        return int(self.resolved_conf().get("spark.cores.max", 2))

    def resolved_conf(self) -> dict[str, str]:
        """Every setting the session is built with: defaults, then local ones, then the user's."""
        conf = dict(DEFAULT_CONF)
        if self.is_local:
            conf.update(LOCAL_CONF)
        conf.update(self.conf)
        return conf


def check_pyspark() -> None:
    """Raise a one-line :class:`UserError` when pyspark cannot be imported."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise UserError("the Spark engine needs pyspark 4.x: pip install 'wavetrain[spark]' (or use --engine "
                        "local)") from None


def java_version(java: str) -> int | None:
    """The major version of the ``java`` executable (None when it does not run)."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return None
    major = int(m[1])
    return int(m[2] or 0) if major == 1 else major


def check_java() -> str:
    """The java executable Spark will start (``$JAVA_HOME/bin/java``, else ``java`` on the PATH);
    a one-line :class:`UserError` when there is none or it is older than Java 17."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    where = f"JAVA_HOME={home}" if home else "the PATH"
    if not java or not os.path.exists(java):
        raise UserError(f"the Spark engine needs Java {MIN_JAVA} or newer and found none on {where}: install one "
                        "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    version = java_version(java)
    if version is None or version < MIN_JAVA:
        found = "a java that does not run" if version is None else f"Java {version}"
        raise UserError(f"the Spark engine needs Java {MIN_JAVA} or newer; {java} is {found}: install Java "
                        f"{MIN_JAVA} or set JAVA_HOME to one")
    return java


#: Spark's JVM log configuration of the driver: errors only, on stderr (Spark's default prints its
#: INFO and WARN lines: a startup banner, native-library notices). The Python gateway's logger set
#: to the root's level keeps Spark from announcing a "default log level" of its own at start-up.
QUIET_LOG4J2 = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
"""
#: Lines the JVM itself prints at start-up (not through log4j), dropped from its standard error.
JVM_NOISE = re.compile(r"^WARNING: Using incubator modules: ")


@contextmanager
def _jvm_stderr_filtered() -> Iterator[None]:
    """While inside, a process started (the Spark JVM, launched by ``getOrCreate``) gets a pipe as
    its standard error; a daemon thread copies the pipe to this process's standard error, line by
    line, dropping :data:`JVM_NOISE`, for as long as the JVM (and the Python workers it starts)
    write to it. This process's own standard error is unchanged outside."""
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    saved = os.dup(2)
    # copying from the start: a JVM that writes more than a pipe holds before it is up must not block
    threading.Thread(target=_relay, args=(read_end, os.dup(saved)), daemon=True, name="jvm-stderr").start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _relay(read_end: int, out: int) -> None:
    """Copy lines from ``read_end`` to ``out`` (both descriptors, closed at the end), without
    :data:`JVM_NOISE`."""
    with os.fdopen(read_end, "rb", buffering=0) as pipe, os.fdopen(out, "wb", buffering=0) as dest:
        for line in iter(pipe.readline, b""):
            if not JVM_NOISE.match(line.decode("utf-8", "replace")):
                try:
                    dest.write(line)
                except OSError:
                    return


def _quiet_log_config() -> str:
    """A log4j2 configuration file with :data:`QUIET_LOG4J2`.

    The file is ``<temporary folder>/wavetrain-log4j2-<uid>.properties``, used as it is when it is
    a regular file of this user with that content, else written by
    :func:`~wavetrain.core.outputs.write_atomic` (an exclusive temporary file with a random name,
    renamed into place). Where that name cannot be (another user's file or a link planted there),
    a private temporary file of this process, removed at exit: the JVM never reads a file someone
    else can change.
    """
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"wavetrain-log4j2-{os.getuid()}.properties")
    data = QUIET_LOG4J2.encode()
    if _own_file_with(path, data):
        return path
    try:
        write_atomic(path, lambda f: _write_private(f, data), what="Spark log configuration", sync=False)
        if _own_file_with(path, data):
            return path
    except OutputError:
        pass
    fd, private = tempfile.mkstemp(prefix="wavetrain-log4j2-", suffix=".properties")    # O_EXCL, mode 600
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    atexit.register(_remove, private)
    return private


def _write_private(f: Any, data: bytes) -> None:
    """Write ``data`` into ``f``, a file only its owner may change (whatever the umask)."""
    os.fchmod(f.fileno(), 0o644)
    f.write(data)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _own_file_with(path: str, data: bytes) -> bool:
    """Whether ``path`` is a regular file (not a link) of this user, that no one else may write,
    holding exactly ``data``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022
                or st.st_size != len(data)):
            return False
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read() == data
    finally:
        os.close(fd)


#: The handlers of the open sessions, innermost last (see :func:`interrupted`).
_GUARDS: list[Interrupt] = []


def interrupted() -> bool:
    """Whether Ctrl-C was pressed during the innermost open session: a job that failed meanwhile
    was cancelled, and is not to be retried."""
    return bool(_GUARDS) and _GUARDS[-1].requested.is_set()


class Interrupt:
    """The SIGINT handler of a session's driver, in place of pyspark's.

    pyspark's handler cancels the jobs from inside the signal handler, on the main thread, which
    is usually waiting for the JVM's answer on the same connection: py4j then logs a reentrant
    call's tracebacks. This handler leaves the JVM to a helper thread, which hides the cancelled
    tasks' errors (JVM log level OFF) and cancels every job now and every half second until the
    session ends (a job started meanwhile is cancelled too). The main thread gets
    :class:`KeyboardInterrupt` at once when it is not talking to the JVM; otherwise its call fails
    as cancelled and :func:`spark_session` turns that into :class:`KeyboardInterrupt`. A second
    Ctrl-C interrupts at once.
    """

    def __init__(self, sc: Any):
        self.sc = sc
        self.requested = threading.Event()
        self.closed = threading.Event()
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        """Replace the SIGINT handler (only the main thread can)."""
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self)
            self._installed = True
        _GUARDS.append(self)

    def restore(self, handler: Any = None) -> None:
        """Stop cancelling and put back ``handler`` (default: the one replaced)."""
        self.closed.set()
        if self in _GUARDS:
            _GUARDS.remove(self)
        if self._installed:
            signal.signal(signal.SIGINT, handler if handler is not None else self._previous)
            self._installed = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.requested.is_set() or self.closed.is_set():
            raise KeyboardInterrupt
        self.requested.set()
        threading.Thread(target=self._cancel, name="wavetrain-cancel", daemon=True).start()
        if not _in_py4j(frame):
            raise KeyboardInterrupt

    def _cancel(self) -> None:
        try:
            self.sc.setLogLevel("OFF")
            while True:
                self.sc.cancelAllJobs()
                if self.closed.wait(0.5):
                    return
        except Exception:  # noqa: BLE001 - the session is going away: nothing left to cancel
            return


def _in_py4j(frame: Any) -> bool:
    """Whether ``frame`` (the main thread's, when a signal came) is inside a call to the JVM."""
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("py4j"):
            return True
        frame = frame.f_back
    return False


@contextmanager
def spark_session(settings: SparkSettings) -> Iterator[Any]:
    """A Spark session for ``settings`` (stopped on exit when this call started it), with Ctrl-C
    handled by :class:`Interrupt`.

    Raises
    ------
    KeyboardInterrupt
        After Ctrl-C, once the jobs are cancelled (and the session stopped when this call
        started it), whatever the interrupted call raised.
    """
    check_pyspark()
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if settings.is_local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    started = SparkSession.getActiveSession() is None
    before = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    builder = SparkSession.builder.master(settings.master) if settings.master else SparkSession.builder
    conf = settings.resolved_conf()
    if "spark.driver.extraJavaOptions" not in conf:      # the driver JVM's own messages: errors only
        conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{_quiet_log_config()}"
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        if started:
            with _jvm_stderr_filtered():
                spark = builder.getOrCreate()
        else:
            spark = builder.getOrCreate()
    except PySparkException as e:
        raise UserError(f"could not start Spark with master {settings.master or 'of spark-submit'!r}: "
                        f"{str(e).splitlines()[0]}") from None
    spark.sparkContext.setLogLevel("ERROR")
    guard = Interrupt(spark.sparkContext)
    guard.install()
    try:
        yield spark
        if guard.requested.is_set():
            raise KeyboardInterrupt
    except Exception:
        if guard.requested.is_set():
            raise KeyboardInterrupt from None
        raise
    finally:
        guard.closed.set()
        try:
            if started:
                spark.stop()
        finally:
            guard.restore(before if started else None)     # not pyspark's: it expects a live context
