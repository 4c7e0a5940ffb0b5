"""Spark settings and the Java check, without starting a JVM."""
import os
import stat

import pytest

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.spark.session import DEFAULT_CONF, MASTER_ENV, SparkSettings, check_java


def test_the_master_comes_from_the_option_else_the_environment_else_local(monkeypatch):
    monkeypatch.delenv(MASTER_ENV, raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert SparkSettings().master == "local[*]"
    monkeypatch.setenv(MASTER_ENV, "spark://head:7077")
    assert SparkSettings().master == "spark://head:7077"
    assert SparkSettings.from_args("local[2]", []).master == "local[2]"


def test_user_settings_win_over_the_defaults_and_local_masters_stay_on_127_0_0_1():
    s = SparkSettings.from_args("local[2]", ["spark.executor.memory=3g", "spark.ui.enabled=true"])
    conf = s.resolved_conf()
    assert conf["spark.executor.memory"] == "3g" and conf["spark.ui.enabled"] == "true"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.executorEnv.OMP_NUM_THREADS"] == DEFAULT_CONF["spark.executorEnv.OMP_NUM_THREADS"] == "1"
    remote = SparkSettings("spark://10.1.2.3:7077").resolved_conf()
    assert "spark.driver.bindAddress" not in remote and not SparkSettings("yarn").is_local
    assert SparkSettings("local[3]").cores() == 3 and SparkSettings("local[*]").cores() == (os.cpu_count() or 1)
    assert SparkSettings("spark://h:1", {"spark.cores.max": "50"}).cores() == 50


@pytest.mark.parametrize("item", ["executor.memory=1g", "spark.executor.memory", "=1g"])
def test_a_malformed_spark_setting_is_refused(item):
    with pytest.raises(ParameterError, match="expected spark.KEY=VALUE"):
        SparkSettings.from_args(None, [item])


def test_the_master_is_never_a_spark_setting():
    """--master is checked (its form, that it answers) before the JVM starts; spark.master would pass by."""
    with pytest.raises(ParameterError, match="give the master as --master spark://127.0.0.1:1"):
        SparkSettings.from_args(None, ["spark.master=spark://127.0.0.1:1"])


def _fake_java(folder, version_line: str):
    java = folder / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return folder


def test_java_older_than_17_or_missing_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path / "j11", 'openjdk version "11.0.2" 2019-01-15')))
    with pytest.raises(UserError, match="needs Java 17 or newer; .* is Java 11"):
        check_java()
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path / "j8", 'java version "1.8.0_292"')))
    with pytest.raises(UserError, match="is Java 8"):
        check_java()
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path / "j21", 'openjdk version "21.0.1" 2023-10-17')))
    assert check_java().endswith("j21/bin/java")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "none"))
    with pytest.raises(UserError, match="found none on JAVA_HOME="):
        check_java()
