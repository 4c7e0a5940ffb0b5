"""A Spark standalone cluster on 127.0.0.1 for tests and benchmarks: one master and a few workers,
each a JVM started with pyspark's own launcher (``$SPARK_HOME/bin/spark-class``), where
``SPARK_HOME`` is the directory of the installed ``pyspark`` package (its pip package has no
``sbin`` scripts).

Every JVM runs in a session (and process group) of its own; ``spark-class`` ends with ``exec``, so
a JVM's pid is that of its :class:`subprocess.Popen`. An executor JVM is a child of its worker's
JVM and in its process group, and the executor's Python daemon and workers are its children, so
killing a worker's process group kills the worker with its executor. Zombie ``[java] <defunct>``
children (``spark-class``'s launcher, never reaped by the JVM that replaced its shell) are
harmless and go with their parent.

Nothing listens on any address but 127.0.0.1: RPC ports and web UIs (which cannot be disabled)
bind ``--host 127.0.0.1`` and ``SPARK_LOCAL_IP``; the master's REST submission server is off.
All ports are chosen by the system (``--port 0``, ``--webui-port 0``); the master's URL is read
from its log.

Measured on the reference machine (2 vCPUs): the master and two workers are ready in about 6 s,
a client session (:func:`session_conf`) starts in about 11 s more, and :meth:`StandaloneCluster.stop`
takes about 2.5 s.

Examples
--------
>>> with StandaloneCluster(workers=2) as cluster:                      # doctest: +SKIP
...     spark = SparkSession.builder.config(map=session_conf(cluster.url)).getOrCreate()
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psutil

__all__ = ["StandaloneCluster", "session_conf", "spark_home"]

HOST = "127.0.0.1"
#: Seconds :meth:`StandaloneCluster.stop` waits after SIGTERM before it sends SIGKILL.
STOP_TIMEOUT_S = 10.0
#: Lines of a log quoted in an error.
LOG_TAIL_LINES = 40

_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_MASTER_URL = re.compile(r"spark://127\.0\.0\.1:(\d+)")
_MASTER_READY = "I have been elected leader"
_WORKER_READY = "Successfully registered with master"
_POLL_S = 0.1


def spark_home() -> str:
    """The Spark installation of the ``pyspark`` package: the directory of ``pyspark/__init__.py``.

    Raises
    ------
    RuntimeError
        When ``pyspark`` is not installed or has no ``bin/spark-class``.
    """
    try:
        import pyspark  # deferred: a heavy optional dependency, needed only to find its files
    except ImportError as e:
        raise RuntimeError("a Spark standalone cluster needs pyspark: pip install pyspark") from e
    home = os.path.dirname(os.path.abspath(pyspark.__file__))
    if not os.path.isfile(os.path.join(home, "bin", "spark-class")):
        raise RuntimeError(f"pyspark at {home} has no bin/spark-class")
    return home


def session_conf(url: str) -> dict[str, str]:
    """Settings of a client (driver) session of a :class:`StandaloneCluster` at ``url``.

    One 1-core executor of 512 MB per worker (two at most), a 512 MB driver bound to 127.0.0.1,
    no UI and no console progress bar. Use with ``SparkSession.builder.config(map=...)``; the
    driver's environment should also set ``SPARK_LOCAL_IP=127.0.0.1`` and ``PYSPARK_PYTHON`` /
    ``PYSPARK_DRIVER_PYTHON`` to the interpreter the executors are to run (``sys.executable``).
    ``spark.driver.memory`` only applies when the session launches the JVM gateway.
    """
    return {
        "spark.master": url,
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.driver.memory": "512m",
        "spark.driver.host": HOST,
        "spark.driver.bindAddress": HOST,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1 (context manager).

    Parameters
    ----------
    workers : int
        Number of workers (one JVM each).
    cores : int
        Cores each worker offers.
    memory : str
        Memory each worker offers to executors (Spark's syntax: ``"1g"``, ``"512m"``).
    work_dir : str or None
        Directory of the logs (``master.log``, ``worker-<i>.log``) and of the workers' work
        directories (``worker-<i>/``: executors' jars and logs). None: a new temporary directory,
        removed by :meth:`stop` unless :meth:`start` failed (its logs are then kept).
    start_timeout_s : float
        Seconds :meth:`start` waits in all for the master and every worker to be ready.

    Examples
    --------
    >>> cluster = StandaloneCluster(workers=2).start()                  # doctest: +SKIP
    >>> cluster.url                                                     # doctest: +SKIP
    'spark://127.0.0.1:41235'
    >>> cluster.stop()                                                  # doctest: +SKIP
    """

    def __init__(self, workers: int = 2, *, cores: int = 1, memory: str = "1g", work_dir: str | None = None,
                 start_timeout_s: float = 60.0) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        if cores < 1:
            raise ValueError(f"cores must be at least 1, not {cores}")
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.start_timeout_s = start_timeout_s
        self._given_work_dir = work_dir
        self.work_dir: Path | None = Path(work_dir) if work_dir is not None else None
        self._master: subprocess.Popen[bytes] | None = None
        self._workers: list[subprocess.Popen[bytes]] = []
        self._url: str | None = None
        self._failed = False
        self._atexit = False

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers, and wait until every worker is registered.

        Returns
        -------
        StandaloneCluster
            ``self``.

        Raises
        ------
        RuntimeError
            When a JVM exits or is not ready within ``start_timeout_s``: the message holds the
            tail of its log. Whatever was started is stopped first.
        """
        if self._master is not None:
            raise RuntimeError("this cluster was started already")
        home = spark_home()
        self._failed = False
        if self.work_dir is None:
            self.work_dir = Path(tempfile.mkdtemp(prefix="wavetrain-spark-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if not self._atexit:
            atexit.register(self.stop)
            self._atexit = True
        spark_class = os.path.join(home, "bin", "spark-class")
        env = self._env(home)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            master_log = self.work_dir / "master.log"
            self._master = self._launch([spark_class, _MASTER_CLASS, "--host", HOST, "--port", "0",
                                         "--webui-port", "0"], env, master_log)
            text = self._wait_for(self._master, master_log, _MASTER_READY, deadline, "the Spark master")
            found = _MASTER_URL.search(text)
            if found is None:
                raise RuntimeError(f"the Spark master's log names no spark://{HOST} URL:\n{_tail(master_log)}")
            self._url = found.group(0)
            logs = []
            for i in range(self.workers):
                worker_dir = self.work_dir / f"worker-{i}"
                worker_dir.mkdir(exist_ok=True)
                log = self.work_dir / f"worker-{i}.log"
                self._workers.append(self._launch(
                    [spark_class, _WORKER_CLASS, "--host", HOST, "--port", "0", "--webui-port", "0",
                     "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(worker_dir), self._url],
                    env, log))
                logs.append(log)
            for i, (proc, log) in enumerate(zip(self._workers, logs)):
                self._wait_for(proc, log, _WORKER_READY, deadline, f"Spark worker {i}")
        except BaseException:
            self._failed = True
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every JVM: SIGTERM to each process group, up to 10 s to exit, then SIGKILL.

        Also kills what is left of their descendants (executors, Python workers). Safe to call at
        any time, more than once, and after a failed or partial :meth:`start`.
        """
        # Only unreaped children are signalled: their pid (and process group id) cannot have been reused.
        procs = [p for p in (*self._workers, self._master) if p is not None and p.returncode is None]
        descendants = _descendants(procs)
        for p in procs:
            _killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        stuck = []
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stuck.append(p)
        for p in stuck:
            _killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=STOP_TIMEOUT_S)
        _kill_all(descendants)
        self._workers = []
        self._master = None
        self._url = None
        if self._atexit:
            atexit.unregister(self.stop)
            self._atexit = False
        if self._given_work_dir is None and self.work_dir is not None and not self._failed:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- inspection and faults -----------------------------------------------------------------

    @property
    def url(self) -> str:
        """The master's URL, ``spark://127.0.0.1:PORT`` (the cluster must be started)."""
        if self._url is None:
            raise RuntimeError("the cluster is not started")
        return self._url

    def worker_pids(self) -> list[int]:
        """Pids of the worker JVMs still running, in worker order."""
        return [p.pid for p in self._workers if p.poll() is None]

    def kill_worker(self, i: int) -> None:
        """Kill worker ``i`` at once (SIGKILL to its process group): its executor and the
        executor's Python processes die with it, as on a lost machine."""
        proc = self._workers[i]
        if proc.returncode is not None:      # reaped already: its pid may belong to another process now
            return
        descendants = _descendants([proc])
        _killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_TIMEOUT_S)
        _kill_all(descendants)               # any that left the process group

    def executor_pids(self, i: int) -> list[int]:
        """Pids of the executor JVMs running under worker ``i`` (none while it has no executor)."""
        return [p.pid for p in self._executors(i)]

    def kill_executor(self, i: int) -> list[int]:
        """Kill the executors of worker ``i`` at once (SIGKILL to each executor JVM and its
        descendants: the PySpark daemon, its Python workers and what they started), as on an
        executor that crashed; the worker lives on and starts new executors when the master
        asks it.

        Returns
        -------
        list of int
            Pids of the executor JVMs killed (empty when the worker had none).
        """
        executors = self._executors(i)
        doomed: list[psutil.Process] = []
        for ex in executors:
            doomed.append(ex)
            with contextlib.suppress(psutil.Error):
                doomed.extend(ex.children(recursive=True))
        _kill_all(doomed)
        return [ex.pid for ex in executors]

    def executor_python_rss(self) -> dict[int, int]:
        """Resident memory (bytes) of the Python processes below each running worker JVM.

        Returns
        -------
        dict of int to int
            Worker pid to the summed RSS of its descendants whose name contains ``python`` (the
            executor's PySpark daemon and Python workers); 0 when it has none (yet).
        """
        out: dict[int, int] = {}
        for pid in self.worker_pids():
            total = 0
            try:
                children = psutil.Process(pid).children(recursive=True)
            except psutil.Error:
                continue
            for child in children:
                try:
                    if "python" in child.name() and child.status() != psutil.STATUS_ZOMBIE:
                        total += child.memory_info().rss
                except psutil.Error:
                    pass
            out[pid] = total
        return out

    # -- helpers -------------------------------------------------------------------------------

    def _executors(self, i: int) -> list[psutil.Process]:
        """The executor JVMs (live children of worker ``i``'s JVM that run the executor class)."""
        proc = self._workers[i]
        if proc.poll() is not None:
            return []
        out = []
        try:
            children = psutil.Process(proc.pid).children()
        except psutil.Error:
            return []
        for child in children:
            try:
                if child.status() != psutil.STATUS_ZOMBIE and _EXECUTOR_CLASS in child.cmdline():
                    out.append(child)
            except psutil.Error:
                pass
        return out

    @staticmethod
    def _env(home: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "SPARK_HOME": home,
            "SPARK_LOCAL_IP": HOST,
            "SPARK_MASTER_OPTS": (env.get("SPARK_MASTER_OPTS", "") + " -Dspark.master.rest.enabled=false").strip(),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        })
        return env

    @staticmethod
    def _launch(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as f:              # the child keeps its own descriptor
            return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    @staticmethod
    def _wait_for(proc: subprocess.Popen[bytes], log: Path, marker: str, deadline: float, what: str) -> str:
        """The text of ``log`` once it holds ``marker``; RuntimeError when ``proc`` exits or time runs out."""
        while True:
            text = log.read_text(errors="replace") if log.exists() else ""
            if marker in text:
                return text
            code = proc.poll()
            if code is not None:
                raise RuntimeError(f"{what} exited with status {code} before it was ready; {log}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} was not ready in time (no {marker!r}); {log}:\n{_tail(log)}")
            time.sleep(_POLL_S)


def _tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(unreadable: {e})"


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _descendants(procs: list[subprocess.Popen[bytes]]) -> list[psutil.Process]:
    out: list[psutil.Process] = []
    for p in procs:
        if p.returncode is None:
            try:
                out.extend(psutil.Process(p.pid).children(recursive=True))
            except psutil.Error:
                pass
    return out


def _kill_all(procs: list[psutil.Process]) -> None:
    """SIGKILL those of ``procs`` still running (``is_running`` guards against reused pids)."""
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                p.kill()
        except psutil.Error:
            pass
