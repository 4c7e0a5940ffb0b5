"""The Spark engine from the command line: every command end to end on local[2], and the wrong
inputs a user makes refused in one line (exit 2)."""
import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from wavetrain.cli.main import main


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


SPARK = ("--engine", "spark", "--master", "local[2]")


def test_train_classify_evaluate_and_features_on_spark(spark, demo_csv, tmp_path, capsys):
    table = tmp_path / "table"
    code, out, err = run(capsys, "train", "--data", demo_csv, "--label", "state", "--set", "components=3", "--model",
                         "gmm", "-o", tmp_path / "m.wt", "--table", table, *SPARK)
    assert code == 0 and "on Spark (local[2])" in out, err
    code, _, err = run(capsys, "classify", "-m", tmp_path / "m.wt", "--data", demo_csv, "-o", tmp_path / "p.parquet",
                       "--table", table, *SPARK)
    assert code == 0, err
    rows = pq.read_table(tmp_path / "p.parquet").to_pylist()
    assert len(rows) == 24 and {r["value"] for r in rows} == {"bearing", "healthy", "loose"}
    code, out, err = run(capsys, "evaluate", "-m", tmp_path / "m.wt", "--data", demo_csv, "--label", "state",
                         "--json", "--table", table, *SPARK)
    assert code == 0, err
    assert json.loads(out)["recordings"] == 24
    code, out, err = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", "--set", "components=3",
                         "--folds", "3", "--json", "--table", table, *SPARK)
    assert code == 0, err
    res = json.loads(out)
    assert len(res["folds"]) == 3 and res["accuracy"] > 0.5
    code, out, err = run(capsys, "features", "--data", demo_csv, "--spec", "logmel(bands=8)", "-o",
                         tmp_path / "t2", *SPARK)
    assert code == 0 and "extracted 24 recording(s), 0 already there" in out, err
    code, out, err = run(capsys, "features", "--data", demo_csv, "--spec", "logmel(bands=8)", "-o",
                         tmp_path / "t2", *SPARK)
    assert code == 0 and "extracted 0 recording(s), 24 already there" in out, err


@pytest.mark.parametrize("argv, message", [
    (("--master", "local[2]"), "--master applies to --engine spark"),
    (("--spark-conf", "spark.executor.memory=1g"), "--spark-conf applies to --engine spark"),
    (("--engine", "spark", "--spark-conf", "executor.memory"), "expected spark.KEY=VALUE"),
    (("--engine", "spark", "--master", "spark://10.0.0.1:7077"), "needs a feature table every executor can reach"),
])
def test_wrong_engine_options_are_one_line(demo_csv, tmp_path, capsys, argv, message):
    code, _, err = run(capsys, "train", "--data", demo_csv, "--label", "state", "--model", "gmm",
                       "-o", tmp_path / "m.wt", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_predictions_file_of_another_format_is_one_line(demo_csv, tmp_path, capsys):
    code, _, err = run(capsys, "classify", "-m", tmp_path / "m.wt", demo_csv, "-o", tmp_path / "p.txt")
    assert code == 2 and ".parquet, .csv, .jsonl" in err


def test_no_java_is_one_line(demo_csv, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    code, _, err = run(capsys, "train", "--data", demo_csv, "--label", "state", "--model", "gmm",
                       "-o", tmp_path / "m.wt", *SPARK)
    assert code == 2 and "needs Java 17 or newer" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.wt").exists()


def test_the_local_engine_imports_no_pyspark(demo_csv, tmp_path):
    script = ("import sys\nfrom wavetrain.cli.main import main\n"
              f"assert main(['train', '--data', {str(demo_csv)!r}, '--label', 'state', '--model', 'gmm', "
              f"'--set', 'components=2', '-o', {str(tmp_path / 'm.wt')!r}]) == 0\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pyarrow', 'py4j')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_a_spark_command_prints_no_jvm_start_up_lines(demo_csv, tmp_path):
    """The JVM's own warnings and Spark's log-level notice are not the user's business: only the
    command's lines (a new process: the module's session would be reused otherwise)."""
    out = subprocess.run([sys.executable, "-m", "wavetrain.cli.main", "features", "--data", str(demo_csv), "--spec",
                          "logmel(bands=8)", "-o", str(tmp_path / "table"), "--engine", "spark", "--master",
                          "local[1]"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "extracted" in out.stdout
    for noise in ("Using incubator modules", "Setting default log level", "setLogLevel", "WARN"):
        assert noise not in out.stderr + out.stdout, out.stderr
