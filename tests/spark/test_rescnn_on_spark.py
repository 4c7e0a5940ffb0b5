"""rescnn trains on Spark because its tags say it can (a gradient-step family that trains as
distributed ranks), not because its name is on a list: two ranks on local[2] through the command
line; its fitted network travels to the executors as its weights, so classifying on Spark answers
as the local engine does.

About 60 s on the reference machine (2 vCPUs; up to 3 minutes when they are shared): the session,
the features, one rank stage.
"""
import pytest

from wavetrain.cli.main import main
from wavetrain.models import family, load_model
from wavetrain.spark.support import spark_support

pytestmark = pytest.mark.slow

SPARK = ("--engine", "spark", "--master", "local[2]")
TINY = ("--set", "features=logmel(bands=16)", "--set", "epochs=1", "--set", "batch_size=8", "--set", "width=4",
        "--set", "valid_fraction=0", "--set", "frames=16")


def test_rescnn_trains_on_spark_from_its_tags(spark, demo_csv, tmp_path, capsys):
    cls = family("rescnn")
    assert cls.learns_by == "sgd" and cls.supports_distributed and spark_support(cls) is None
    out = tmp_path / "m.wt"
    code = main(["train", "--data", str(demo_csv), "--label", "state", "--model", "rescnn", *TINY, "--clip-ms", "250",
                 "--processes", "2", "--table", str(tmp_path / "table"), "-o", str(out), *SPARK])
    captured = capsys.readouterr()
    assert code == 0 and "on Spark (local[2])" in captured.out, captured.err
    model = load_model(out)
    assert model.name == "rescnn" and model.meta_["training"]["engine"] == "spark"
    assert sorted(model.fitted_labels) == ["bearing", "healthy", "loose"]
    # a fitted rescnn travels to the executors as its weights: classify on Spark answers as locally
    preds = tmp_path / "p.csv"
    code = main(["classify", "-m", str(out), str(demo_csv), "-o", str(preds), "--table", str(tmp_path / "table"),
                 *SPARK])
    assert code == 0, capsys.readouterr().err
    local = tmp_path / "local.csv"
    assert main(["classify", "-m", str(out), str(demo_csv), "-o", str(local)]) == 0
    import csv

    def answers(path):
        with open(path, newline="") as f:
            return sorted((r["file"], r["start_ms"], r["value"]) for r in csv.DictReader(f))

    assert answers(preds) == answers(local)
