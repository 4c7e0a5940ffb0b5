"""Embedding features on the Spark engine (local[1]): the executors read the network's model file
and embed the recordings in their tasks, and a detector trained on those embeddings is the model
trained locally (the same threshold)."""
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
sf = pytest.importorskip("soundfile")

from tests.features.test_embedding import RATE, SECTIONS, _clip  # noqa: E402
from wavetrain.cli.main import main  # noqa: E402
from wavetrain.models import load_model  # noqa: E402


def test_a_detector_on_embeddings_on_spark_has_the_local_threshold(tmp_path, capsys):
    rng = np.random.default_rng(1)
    rows = []
    for section, f0 in SECTIONS.items():
        for i in range(6):
            name = f"{section}_{i}.wav"
            sf.write(tmp_path / name, _clip(rng, f0), RATE)
            rows.append(f"{name},section={section};state=normal,")
    (tmp_path / "metadata.csv").write_text("\n".join(rows) + "\n")
    net = tmp_path / "sections.wt"
    assert main(["train", "--data", str(tmp_path), "--label", "section", "--model", "cnn", "--set", "epochs=2",
                 "--set", "features=logmel(bands=32)", "--clip-ms", "500", "--clip-shift-ms", "240",
                 "-o", str(net)]) == 0
    detector = ["train", "--data", str(tmp_path), "--label", "state", "--model", "knn-anomaly", "--set",
                f"features=embedding(model={net})"]
    assert main([*detector, "-o", str(tmp_path / "local.wt")]) == 0
    capsys.readouterr()
    code = main([*detector, "-o", str(tmp_path / "spark.wt"), "--engine", "spark", "--master", "local[1]",
                 "--table", str(tmp_path / "table")])
    out, err = capsys.readouterr()
    assert code == 0 and "on Spark (local[1])" in out, err
    local, on_spark = load_model(tmp_path / "local.wt"), load_model(tmp_path / "spark.wt")
    assert np.isfinite(local.threshold_)
    assert on_spark.threshold_ == pytest.approx(local.threshold_, rel=1e-5)
    assert on_spark.params["features"] == local.params["features"] and "model_sha=" in local.params["features"]
