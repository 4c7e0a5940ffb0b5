"""Every option of classify and evaluate that makes sense on Spark runs there (local[2]) and prints
what the local engine prints: the jobs are written once (wavetrain.pipeline.jobs) and only the
engine differs. What cannot run there is refused in one line, before the JVM."""
import json

import pytest

from tests.spark.test_cli_spark import SPARK, run
from wavetrain.cli.main import main


@pytest.fixture(scope="module")
def model_file(demo_csv, tmp_path_factory):
    """A gmm of 400 ms windows (several per recording, so that smoothing and holding matter)."""
    path = tmp_path_factory.mktemp("model") / "m.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=2",
                 "--clip-ms", "400", "-o", str(path), "--no-cache"]) == 0
    return path


def both(capsys, tmp_path, *argv):
    """stdout of the command on each engine (each with its own store or table)."""
    code, local, err = run(capsys, *argv, "--cache", tmp_path / "local-cache")
    assert code == 0, err
    code, spark, err = run(capsys, *argv, "--table", tmp_path / "table", "--cache", tmp_path / "spark-cache", *SPARK)
    assert code == 0, err
    return local, spark


@pytest.mark.parametrize("options", [
    ("--csv",),
    ("--ranked",),
    ("--json", "--ranked"),
    ("--compare", "state"),
    ("--smooth", "3", "--hold", "800"),
    ("--smooth", "2", "--unknown", "auto", "--json"),
], ids=["csv", "ranked", "json-ranked", "compare", "smooth-hold", "unknown"])
def test_classify_prints_what_the_local_engine_prints(spark, capsys, tmp_path, demo_csv, model_file, options):
    local, on_spark = both(capsys, tmp_path, "classify", "-m", model_file, "--data", demo_csv, *options)
    assert on_spark == local and len(local.splitlines()) > 24


def test_audacity_tracks_and_a_predictions_file_are_the_local_ones(spark, capsys, tmp_path, demo_csv, model_file):
    for engine, extra in (("local", ()), ("spark", ("--table", tmp_path / "table", *SPARK))):
        code, _, err = run(capsys, "classify", "-m", model_file, "--data", demo_csv, "--audacity",
                           tmp_path / f"{engine}-tracks", "-o", tmp_path / f"{engine}.jsonl", "--compare", "state",
                           *extra)
        assert code == 0, err
    local = sorted((tmp_path / "local-tracks").iterdir())
    assert len(local) == 24
    for path in local:
        assert (tmp_path / "spark-tracks" / path.name).read_text() == path.read_text()
    assert (tmp_path / "spark.jsonl").read_text() == (tmp_path / "local.jsonl").read_text()


def _untimed(value):
    """A result without its timings (they differ from run to run)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if "seconds" not in k}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def test_repeated_kfold_and_a_memory_limit_give_the_local_report(spark, capsys, tmp_path, demo_csv):
    local, on_spark = both(capsys, tmp_path, "evaluate", "--data", demo_csv, "--label", "state", "--model", "gmm",
                           "--set", "components=2", "--folds", "3", "--repeat", "2", "--memory-limit", "2G", "--json")
    assert _untimed(json.loads(on_spark)) == _untimed(json.loads(local))
    assert len(json.loads(local)["repeats"]) == 2


def test_an_exported_graph_classifies_on_spark_as_locally(spark, capsys, tmp_path, demo_csv, model_file):
    pytest.importorskip("onnxruntime")
    graph = tmp_path / "m.onnx"
    code, _, err = run(capsys, "export", "-m", model_file, "-o", graph)
    assert code == 0, err
    local, on_spark = both(capsys, tmp_path, "classify", "-m", graph, "--data", demo_csv, "--json")
    assert on_spark == local and len(local.splitlines()) > 24


def test_a_memory_limit_too_small_for_an_executor_is_one_line(capsys, tmp_path, demo_csv, model_file):
    code, _, err = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", "--model", "gmm",
                       "--memory-limit", "100M", "--table", tmp_path / "table", *SPARK)
    assert code == 2 and "on Spark an executor's Python worker needs" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, message", [
    (("classify", "-m", "MODEL", "-"), "a live stream is classified as it arrives, in this process"),
    (("train", "--data", "DATA", "--label", "state", "--model", "cnn", "--devices", "cpu,cpu", "-o", "OUT"),
     "--devices: a device group shares each step in this process"),
])
def test_what_runs_in_this_process_only_is_refused_before_the_jvm(capsys, tmp_path, demo_csv, model_file, argv,
                                                                  message, monkeypatch):
    import wavetrain.spark.session as session

    def refuse(settings):
        raise AssertionError("Spark was started for a run that could be refused without it")

    monkeypatch.setattr(session, "spark_session", refuse)
    names = {"MODEL": model_file, "DATA": demo_csv, "OUT": tmp_path / "m.wt"}
    code, _, err = run(capsys, *(names.get(a, a) for a in argv), *SPARK)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
