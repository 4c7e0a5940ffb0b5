"""The Spark standalone test cluster: a job survives a worker killed while it runs, the executors'
Python memory can be measured, nothing listens beyond 127.0.0.1, and stop() leaves no JVM behind.

About 50 s on the reference machine (2 vCPUs): the cluster ~6-15 s, the client session ~11-19 s,
the job ~15 s (it finishes on one worker after the other is killed).
"""
from __future__ import annotations

import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from operator import add

import psutil
import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("a Spark cluster needs java", allow_module_level=True)

from wavetrain.spark.standalone import StandaloneCluster, session_conf  # noqa: E402

TASKS = 6
TASK_S = 1.5


@dataclass
class _Seen:
    """What the thread that kills a worker saw."""

    rss: dict[int, int] = field(default_factory=dict)
    executor_jvms: list[psutil.Process] = field(default_factory=list)
    listening: set[str] = field(default_factory=set)
    victim: int = -1
    left: list[int] = field(default_factory=list)
    killed_at: float = float("inf")
    error: BaseException | None = None


def _listening(procs: list[psutil.Process]) -> set[str]:
    """Addresses the processes listen on (IPv4-mapped IPv6 shown as IPv4)."""
    out = set()
    for p in procs:
        for c in p.net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN:
                out.add(c.laddr.ip.removeprefix("::ffff:"))
    return out


def test_job_survives_a_killed_worker_and_stop_leaves_nothing(monkeypatch, tmp_path):
    from pyspark.sql import SparkSession

    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    with StandaloneCluster(workers=2, work_dir=str(tmp_path / "cluster")) as cluster:
        assert cluster.url.startswith("spark://127.0.0.1:")
        assert cluster._master is not None
        jvms = [psutil.Process(pid) for pid in [cluster._master.pid, *cluster.worker_pids()]]
        assert len(jvms) == 3
        assert all(p.name() == "java" for p in jvms), "spark-class must exec the JVM in place"

        spark = SparkSession.builder.config(map=session_conf(cluster.url)).getOrCreate()
        try:
            sc = spark.sparkContext
            assert sc.master == cluster.url, "another SparkContext was active in this process"
            watchdog = threading.Timer(120, sc.cancelAllJobs)      # never hang the test suite
            watchdog.daemon = True
            watchdog.start()

            seen = _Seen()

            def kill_one_mid_job() -> None:
                try:
                    deadline = time.monotonic() + 60
                    # Both executors running Python (a task each): the job is under way.
                    while time.monotonic() < deadline:
                        seen.rss = cluster.executor_python_rss()
                        if len(seen.rss) == 2 and all(v > 0 for v in seen.rss.values()):
                            break
                        time.sleep(0.2)
                    below = [c for pid in cluster.worker_pids() for c in psutil.Process(pid).children(recursive=True)]
                    seen.executor_jvms = [c for c in below if c.name() == "java" and c.status() != psutil.STATUS_ZOMBIE]
                    seen.listening = _listening(jvms + seen.executor_jvms)
                    seen.victim = cluster.worker_pids()[0]
                    cluster.kill_worker(0)
                    seen.killed_at = time.monotonic()
                    seen.left = cluster.worker_pids()
                except BaseException as e:                          # reported by the main thread
                    seen.error = e

            killer = threading.Thread(target=kill_one_mid_job, daemon=True)
            started = time.monotonic()
            killer.start()
            # A lambda, pickled by value: the executors cannot import this test module.
            total = sc.parallelize(range(TASKS), TASKS).map(lambda i: (time.sleep(TASK_S), i * i)[1]) \
                .treeAggregate(0, add, add)
            finished = time.monotonic()
            killer.join(timeout=30)
            watchdog.cancel()

            assert seen.error is None, seen.error
            assert total == sum(i * i for i in range(TASKS))
            assert len(seen.rss) == 2 and all(v > 0 for v in seen.rss.values()), seen.rss
            assert started < seen.killed_at < finished, "the worker must die while the job runs"
            assert seen.victim not in seen.left and len(seen.left) == 1
            assert len(seen.executor_jvms) == 2
            assert seen.listening == {"127.0.0.1"}, seen.listening
        finally:
            spark.stop()
        executors = seen.executor_jvms
    # stop() ran on leaving the block
    assert cluster.worker_pids() == []
    left = [p for p in [*jvms, *executors] if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"still running after stop(): {left}"
