"""Spark settings, the Java check and the session the engine's jobs run in.

:func:`spark_session` starts (or joins) a session for :class:`SparkSettings`: the master
(``--master``, else ``$WAVETRAIN_SPARK_MASTER``, else ``local[*]``), wavetrain's defaults
(:data:`DEFAULT_CONF`) and the user's ``--spark-conf key=value`` settings, which win. pyspark and
Java are checked first, each with a one-line error that says what to install; a master URL Spark
would refuse is refused when the settings are made (:func:`check_master`), and a ``spark://``
master that takes no TCP connection before the JVM starts (:func:`check_master_reachable`: seconds,
where Spark would try for a minute). A start that Spark refuses (a Java exception, a JVM that
exits at once, a master that does not take the application) is one line naming the cause, and
Ctrl-C while the session starts is :class:`KeyboardInterrupt`; either way the JVM this process
launched and what it started are ended, its temporary folders with them (:class:`_Launch`).

Ctrl-C during a session cancels its jobs (:class:`Interrupt`): the driver's call waiting on a job
is never cut in the middle of a message to the JVM (that prints py4j's tracebacks), the job fails
as cancelled, and the session ends with :class:`KeyboardInterrupt` (``wavetrain: interrupted``,
exit code 130).
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from typing import Any

import psutil

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.extras import MissingExtraError, import_extra, require
from wavetrain.core.outputs import OutputError, write_atomic

__all__ = ["DEFAULT_CONF", "MASTER_CONNECT_TIMEOUT_S", "MASTER_ENV", "Interrupt", "SparkSettings", "check_java",
           "check_master", "check_master_reachable", "check_pyspark", "interrupted", "master_addresses",
           "spark_session"]

log = logging.getLogger(__name__)

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
        source = "--master" if self.master else f"${MASTER_ENV}"
        self.master = (self.master or os.environ.get(MASTER_ENV) or default).strip()
        check_master(self.master, source)

    @classmethod
    def from_args(cls, master: str | None, items: list[str] | None) -> SparkSettings:
        """``--master`` and the ``--spark-conf key=value`` items of the command line."""
        conf = {}
        for it in items or []:
            key, sep, value = it.partition("=")
            if not sep or not key.strip() or not key.strip().startswith("spark."):
                raise ParameterError(f"--spark-conf {it!r}: expected spark.KEY=VALUE (e.g. "
                                     "--spark-conf spark.executor.memory=2g)")
            if key.strip() == "spark.master":       # (it would pass by --master's checks)
                raise ParameterError(f"--spark-conf {it!r}: give the master as --master {value.strip() or 'URL'}")
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


#: ``local``, ``local[N]``, ``local[*]``, ``local[N|*,F]`` (F: failures a task may have),
#: ``local-cluster[N,C,M]``: Spark's own patterns.
_LOCAL_MASTER = re.compile(r"local(?:\[(\d+|\*)(?:\s*,\s*\d+)?\])?"
                           r"|local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]")
#: One ``HOST:PORT`` of a ``spark://`` master (a host name, an IPv4 address or an IPv6 one in brackets).
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})")
_MASTER_FORMS = ("local, local[N], local[*], spark://HOST:PORT (masters with standby ones: "
                 "spark://HOST1:PORT1,HOST2:PORT2), yarn or k8s://HOST:PORT")
#: Seconds a TCP connection to a ``spark://`` master may take before it is reported unreachable.
MASTER_CONNECT_TIMEOUT_S = 5.0


def check_master(master: str, option: str = "--master") -> None:
    """Refuse, before any JVM starts, a master URL Spark would refuse (``option`` names where it
    came from); ``""`` (spark-submit's master) passes.

    Raises
    ------
    ParameterError
        A master that is not ``local[...]``, ``spark://HOST:PORT[,HOST:PORT...]``, ``yarn`` or
        ``k8s://...``, or one of these malformed (``local[0]``, ``spark://head``).
    """
    if not master or master == "yarn" or master.startswith("k8s://"):
        return
    if master.startswith("local"):
        m = _LOCAL_MASTER.fullmatch(master)
        if m and all(g is None or g == "*" or int(g) > 0 for g in m.groups()):
            return
    elif master.startswith("spark://"):
        for part in master[len("spark://"):].split(","):
            m = _HOST_PORT.fullmatch(part.strip())
            if not m or not 0 < int(m[2]) < 65536:
                raise ParameterError(f"{option} {master!r}: {part.strip() or 'nothing'!r} is not HOST:PORT (a "
                                     "standalone master is spark://HOST:PORT, port 7077 by default)", param="master")
        return
    raise ParameterError(f"{option} {master!r}: expected {_MASTER_FORMS}", param="master")


def master_addresses(master: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` of each master of a ``spark://`` URL (``[]`` for other masters)."""
    if not master.startswith("spark://"):
        return []
    out = []
    for part in master[len("spark://"):].split(","):
        m = _HOST_PORT.fullmatch(part.strip())
        if m:
            out.append((m[1].strip("[]"), int(m[2])))
    return out


def check_master_reachable(master: str, timeout_s: float = MASTER_CONNECT_TIMEOUT_S) -> None:
    """Refuse a ``spark://`` master none of whose addresses takes a TCP connection within
    ``timeout_s`` seconds, before the JVM starts (Spark itself would try for a minute, then fail
    with a Java stack trace). Other masters pass.

    Raises
    ------
    UserError
        Naming each address and what went wrong (connection refused, no answer, unknown host).
    """
    problems = []
    for host, port in master_addresses(master):
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except socket.gaierror:
            problem = "unknown host"
        except TimeoutError:
            problem = f"no answer in {timeout_s:g} s"
        except OSError as e:
            problem = (e.strerror or str(e)).lower()
        problems.append(f"{host}:{port}: {problem}")
    if problems:
        raise UserError(f"cannot reach the Spark master {master} ({'; '.join(problems)}): start it, or give "
                        "--master the spark://HOST:PORT its log shows ('Starting Spark master at ...', port 7077 "
                        "by default)")


def check_pyspark() -> None:
    """Raise a one-line :class:`UserError` when pyspark cannot be imported (or pyarrow, its
    feature table's, is missing)."""
    try:
        import_extra("pyspark", "the Spark engine")
        require("pyarrow", "the Spark engine")
    except MissingExtraError as e:
        raise MissingExtraError(f"{e}; or use --engine local", extra=e.extra, module=e.module) from None


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


#: Lines of the JVM's standard error a session keeps while it starts (the rest are dropped).
HELD_LINES = 2000


class _JvmStderr:
    """The standard error of the JVM a session launches: while inside, a process started (the
    Spark JVM, launched by ``getOrCreate``) gets a pipe as its standard error, which a daemon
    thread reads line by line, dropping :data:`JVM_NOISE`, for as long as the JVM (and the Python
    workers it starts) write to it. This process's own standard error is unchanged outside.

    Until :meth:`release` the lines are held (up to :data:`HELD_LINES`): a session that started
    prints them then, and copies later ones as they come; after :meth:`mute` (a start that failed:
    its error says why in one line) none is printed, and :attr:`lines` are what the JVM said.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._mode = "hold"
        self._lock = threading.Lock()
        self._dest: Any = None
        self._saved = -1
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _JvmStderr:
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        self._saved = os.dup(2)
        self._dest = os.fdopen(os.dup(self._saved), "wb", buffering=0)
        # reading from the start: a JVM that writes more than a pipe holds before it is up must not block
        self._thread = threading.Thread(target=self._relay, args=(read_end,), daemon=True, name="jvm-stderr")
        self._thread.start()
        os.dup2(write_end, 2)
        os.close(write_end)
        return self

    def __exit__(self, *exc: object) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)

    def release(self) -> None:
        """Print the lines held so far, and every later one as it comes."""
        with self._lock:
            self._mode = "copy"
            self._write(b"".join(f"{line}\n".encode() for line in self.lines))
            self.lines = []

    def mute(self, wait_s: float = 2.0) -> list[str]:
        """Print nothing more, and return what the JVM wrote: called after leaving, once the JVM's
        processes are gone, it waits up to ``wait_s`` seconds for their last lines."""
        with self._lock:
            self._mode = "mute"
        if self._thread is not None:
            self._thread.join(wait_s)
        with self._lock:
            return list(self.lines)

    def _relay(self, read_end: int) -> None:
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\n")
                if JVM_NOISE.match(line):
                    continue
                with self._lock:
                    if self._mode == "copy":
                        self._write(raw)
                    elif len(self.lines) < HELD_LINES:
                        self.lines.append(line)
        with self._lock:
            if self._dest is not None:
                self._dest.close()
                self._dest = None

    def _write(self, data: bytes) -> None:
        if data and self._dest is not None:
            try:
                self._dest.write(data)
            except OSError:
                pass


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


#: Seconds the processes of a start that failed or was interrupted get to exit after SIGTERM
#: (the JVM's shutdown hooks remove Spark's temporary folders) before they get SIGKILL.
JVM_STOP_TIMEOUT_S = 10.0
#: Seconds a call to the JVM that Ctrl-C came in while a session starts may go on before the JVM
#: is ended under it (a JVM ended while it makes its context can leave folders it makes meanwhile).
STOP_GRACE_S = 10.0
#: What the JVM logs when a standalone master did not take the application (its reason follows).
_APP_KILLED = re.compile(r"Application has been killed\. Reason: (.*)")
#: A JVM that ended before its gateway was up: ``Exception in thread "main" CLASS: MESSAGE``.
_MAIN_EXCEPTION = re.compile(r'Exception in thread "main" [\w.$]+(?:: (.*))?')


class _Launch:
    """The start of a session: Ctrl-C meanwhile, and what a start that failed leaves.

    Until :meth:`restore`, SIGINT is handled here (pyspark's handler, installed when its context
    is made, is replaced again at once: it calls the JVM from inside the handler). A first Ctrl-C
    sets :attr:`requested`. Outside a call to the JVM the main thread gets
    :class:`KeyboardInterrupt` at once and, when the JVM is this start's own (``owned``: this
    process launches it), a helper thread ends it and every process it started (SIGTERM, SIGKILL
    after :data:`JVM_STOP_TIMEOUT_S`). Inside a call (a message cut in the middle makes py4j print
    tracebacks) the call may end first, for up to :data:`STOP_GRACE_S` seconds; then the JVM is
    ended under it and the call fails. Either way the start ends with :class:`KeyboardInterrupt`.
    A second Ctrl-C interrupts at once.

    :meth:`end` undoes a start that failed or was interrupted: the processes it started are gone
    (a JVM launched by pyspark and interrupted before its gateway answered would otherwise
    live on: its gateway server thread outlives its main thread) and pyspark forgets the JVM, so
    the next session launches a new one.
    """

    def __init__(self, owned: bool):
        self.owned = owned
        self.requested = threading.Event()
        #: Set by the caller when the start's calls have ended (returned or raised).
        self.finished = threading.Event()
        self._before = _descendants() if owned else set()
        self._stoppers: list[threading.Thread] = []
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        """Handle SIGINT here (only the main thread can); again after pyspark replaced it."""
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, self)
            if not self._installed:
                self._previous, self._installed = previous, True

    def restore(self) -> None:
        """Put back the handler :meth:`install` replaced."""
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.requested.is_set() or not _in_py4j(frame):
            self.requested.set()
            self._stop_after(0.0)
            raise KeyboardInterrupt
        self.requested.set()
        self._stop_after(STOP_GRACE_S)

    def _stop_after(self, grace_s: float) -> None:
        """End the processes from a helper thread, once the start's calls have ended or after
        ``grace_s`` seconds, whichever comes first (at once for 0)."""
        if not self.owned:
            return

        def stop() -> None:
            if grace_s <= 0 or not self.finished.wait(grace_s):
                self.stop_processes()

        thread = threading.Thread(target=stop, name="wavetrain-stop-jvm", daemon=True)
        self._stoppers.append(thread)
        thread.start()

    def stop_processes(self) -> None:
        """End the processes started since this start began (the JVM, its launcher, its Python
        workers): SIGTERM, then SIGKILL to those still there after :data:`JVM_STOP_TIMEOUT_S`."""
        if not self.owned:
            return
        procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in self._before]
        for p in procs:
            with suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(procs, timeout=JVM_STOP_TIMEOUT_S)
        for p in alive:
            with suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=JVM_STOP_TIMEOUT_S)

    def end(self) -> None:
        """Undo a start that failed or was interrupted (see the class)."""
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        self.finished.set()
        for thread in self._stoppers:
            thread.join()
        sc = SparkContext._active_spark_context
        if self.owned:
            self.stop_processes()
            if sc is not None:
                sc._jsc = None                      # its JVM is gone: nothing to stop there
            gateway = SparkContext._gateway
            SparkContext._gateway = None
            SparkContext._jvm = None
            if gateway is not None:
                with suppress(Exception):
                    gateway.close()
        if sc is not None:
            with suppress(Exception):
                sc.stop()                           # (and the accumulator server of a context made)
        SparkContext._active_spark_context = None
        SparkSession._instantiatedSession = None
        SparkSession._activeSession = None


def _descendants() -> set[int]:
    """The process ids of this process's children, theirs, and so on."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _from_py4j(record: logging.LogRecord) -> bool:
    """False for a log record of py4j's (its errors about a call that was cut or a JVM that went)."""
    return f"{os.sep}py4j{os.sep}" not in record.pathname


@contextmanager
def _py4j_quiet() -> Iterator[None]:
    """Inside, py4j's own logs (some are on the root logger) and pyspark's warning about a JVM it
    could not stop are dropped: a start that fails says why in one line."""
    py4j = logging.getLogger("py4j")
    level = py4j.level
    py4j.setLevel(logging.CRITICAL + 1)
    root = logging.getLogger()
    root.addFilter(_from_py4j)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Unable to cleanly shutdown Spark JVM", category=RuntimeWarning)
            yield
    finally:
        root.removeFilter(_from_py4j)
        py4j.setLevel(level)


def _java_message(error: Any) -> str:
    """The first line of the message of the Java exception behind a ``Py4JJavaError``."""
    try:
        java = error.java_exception
        text = str(java.getMessage() or java.toString())
    except Exception:  # noqa: BLE001 - the JVM went away: py4j's own words
        text = str(getattr(error, "errmsg", "") or error)
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "a Java error")


def _exited_because(lines: list[str]) -> str | None:
    """Why a JVM ended before its gateway answered, from what it wrote: the main thread's
    exception, else its first line that is not a stack frame nor the JVM's boilerplate."""
    for line in lines:
        m = _MAIN_EXCEPTION.match(line)
        if m:
            return m[1] or line
    return next((ln.strip() for ln in lines if ln.strip() and not ln[:1].isspace()
                 and not ln.startswith("Error: ")), None)


class _NotTaken(Exception):
    """A standalone master did not take the application (the context started without it)."""


def _start_failure(settings: SparkSettings, error: BaseException, lines: list[str], java: str | None) -> UserError:
    """The one-line error of a session that did not start: from ``error``, the JVM's standard
    error ``lines`` and ``java``, the message of the Java exception behind ``error``, if any."""
    master = settings.master or "of spark-submit"
    if master_addresses(settings.master):
        reason = next((m[1].strip() for m in map(_APP_KILLED.search, lines) if m), None)
        if reason or isinstance(error, _NotTaken):
            return UserError(f"the Spark master {master} did not take this application"
                             f"{f' ({reason})' if reason else ''}: check that --master is the spark://HOST:PORT "
                             "the master's log shows (port 7077 by default, not its web UI's) and that it is up")
    detail = java or next((ln.strip() for ln in str(error).splitlines() if ln.strip()), type(error).__name__)
    if "JAVA_GATEWAY_EXITED" in detail:
        because = _exited_because(lines)
        if because:
            detail = f"Java exited as it started: {because}"
    return UserError(f"could not start Spark with master {master!r}: {detail}")


def _start(settings: SparkSettings, conf: dict[str, str]) -> Any:
    """A new session with ``conf``: Ctrl-C meanwhile is :class:`KeyboardInterrupt`, a failure of
    Spark (a Java exception, a JVM that exits, a standalone master that does not take the
    application) a one-line :class:`UserError`; either way nothing of it is left (see
    :class:`_Launch`). Other errors are raised as they are, after the same clean-up."""
    from py4j.protocol import Py4JError, Py4JJavaError
    from pyspark import SparkConf, SparkContext
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    options: dict[str, Any] = dict(conf)
    owned = SparkContext._gateway is None and not os.environ.get("PYSPARK_GATEWAY_PORT")
    launch = _Launch(owned)
    stderr = _JvmStderr() if owned else None
    launch.install()
    try:
        with _py4j_quiet():
            try:
                with stderr or nullcontext():
                    sc = SparkContext.getOrCreate(SparkConf().setAll(list(conf.items())))
                    launch.install()                # again: pyspark put in its own
                    if launch.requested.is_set():
                        raise KeyboardInterrupt
                    if master_addresses(settings.master) and not str(sc.applicationId).startswith("app-"):
                        raise _NotTaken
                    spark = SparkSession.builder.config(map=options).getOrCreate()
                    spark.sparkContext.setLogLevel("ERROR")
                if launch.requested.is_set():
                    raise KeyboardInterrupt
            except BaseException as e:
                launch.finished.set()
                interrupted = launch.requested.is_set() or isinstance(e, KeyboardInterrupt)
                java = None
                if isinstance(e, Py4JJavaError) and not interrupted:
                    java = _java_message(e)         # (asks the JVM: before it ends)
                launch.end()
                lines = stderr.mute() if stderr is not None else []
                for line in lines:
                    log.info("Spark's JVM: %s", line)
                if interrupted:
                    raise KeyboardInterrupt from None
                if isinstance(e, (Py4JError, PySparkException, _NotTaken)):
                    raise _start_failure(settings, e, lines, java) from None
                raise
    finally:
        launch.restore()
    if stderr is not None:
        stderr.release()
    return spark


@contextmanager
def spark_session(settings: SparkSettings) -> Iterator[Any]:
    """A Spark session for ``settings`` (stopped on exit when this call started it), with Ctrl-C
    handled by :class:`Interrupt`.

    A session this call starts is checked first: pyspark and Java installed, a ``spark://``
    master reachable (:func:`check_master_reachable`, within seconds); a start that Spark refuses
    is a one-line :class:`UserError`, and Ctrl-C while it starts :class:`KeyboardInterrupt`, with
    no JVM left behind (:class:`_Launch`).

    Raises
    ------
    UserError
        pyspark or Java missing, a master that cannot be reached or does not take the
        application, a setting Spark refuses as it starts.
    KeyboardInterrupt
        After Ctrl-C, once the jobs are cancelled (and the session stopped when this call
        started it), whatever the interrupted call raised.
    """
    check_pyspark()
    check_java()
    from pyspark.sql import SparkSession

    started = SparkSession.getActiveSession() is None
    before = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if started:
        check_master_reachable(settings.master)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if settings.is_local:
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        conf = {"spark.master": settings.master} if settings.master else {}
        conf.update(settings.resolved_conf())
        if "spark.driver.extraJavaOptions" not in conf:      # the driver JVM's own messages: errors only
            conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{_quiet_log_config()}"
        spark = _start(settings, conf)
    else:
        spark = SparkSession.builder.getOrCreate()
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
