import csv

import numpy as np
import pytest

sf = pytest.importorskip("soundfile")
pytest.importorskip("wavetrain.data")
from wavetrain.cli.main import main  # noqa: E402


@pytest.fixture
def data_dir(tmp_path):
    rate = 16000
    for cls, freq in (("a", 440.0), ("b", 1000.0)):
        (tmp_path / "data" / cls).mkdir(parents=True)
        for i in range(2):
            t = np.arange(rate) / rate
            sf.write(tmp_path / "data" / cls / f"{cls}{i}.wav",
                     (0.3 * np.sin(2 * np.pi * freq * (i + 1) * t)).astype(np.float32), rate)
    return tmp_path / "data"


def test_features_command(data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["features", "--data", str(data_dir), "--spec", "mfcc | delta",
                 "-o", str(out), "--no-progress"]) == 0
    with open(out / "index.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    for row in rows:
        feats = np.load(out / row["file"])
        assert feats.dtype == np.float32 and feats.shape == (49, 39)
        assert int(row["frames"]) == 49 and int(row["features"]) == 39
        assert row["spec"].startswith("mfcc(") and row["id"]
    assert "wrote 4 feature file(s)" in capsys.readouterr().out


def test_features_command_bad_spec(data_dir, tmp_path, capsys):
    code = main(["features", "--data", str(data_dir), "--spec", "mfcc(band=3)",
                 "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "column 6" in err and err.count("\n") == 1


def test_features_command_short_recording(data_dir, tmp_path, capsys):
    sf.write(data_dir / "a" / "short.wav", np.zeros(100, np.float32), 16000)
    code = main(["features", "--data", str(data_dir), "--spec", "logmel", "-o",
                 str(tmp_path / "o"), "--no-progress"])
    assert code == 2 and "short.wav" in capsys.readouterr().err
    code = main(["features", "--data", str(data_dir), "--spec", "logmel", "-o",
                 str(tmp_path / "o"), "--skip-bad", "--no-progress"])
    assert code == 0 and "skipped 1" in capsys.readouterr().out


def test_plot_command(data_dir, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "p.png"
    assert main(["plot", "--spec", "fft(bins=64, log=true)", str(data_dir / "a" / "a0.wav"),
                 "-o", str(out)]) == 0
    assert out.stat().st_size > 1000
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_plot_command_errors(data_dir, tmp_path, capsys):
    assert main(["plot", str(tmp_path / "missing.wav"), "-o", str(tmp_path / "p.png")]) == 2
    assert main(["plot", str(data_dir / "a" / "a0.wav"), "-o", str(tmp_path / "p.txt")]) == 2
