import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def model_file(demo_csv, tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "m.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm",
                 "--set", "components=4", "-o", str(path)]) == 0
    return path


def test_train_classify_round_trip(capsys, demo_csv, model_file):
    wav = sorted(demo_csv.parent.glob("bearing_*.wav"))[0]
    code, out, _ = run(capsys, "classify", "-m", str(model_file), str(wav))
    assert code == 0
    line = out.strip()
    # a GMM reports what it estimates: mean frame log-likelihoods, not a probability
    assert line.startswith(f"{wav}[0-1000]: state=") and " loglik=" in line and " margin=" in line
    assert "confidence" not in line
    code, out, _ = run(capsys, "classify", "-m", str(model_file), "--json", str(wav))
    rec = json.loads(out)
    assert rec["label"] == "state" and rec["value"] in ("healthy", "bearing", "loose")
    assert rec["score_kind"] == "mean_loglik" and "confidence" not in rec
    assert rec["loglik"] == pytest.approx(max(rec["scores"].values()), abs=1e-4)
    assert max(rec["scores"].values()) == rec["scores"][rec["value"]]
    assert rec["margin"] > 0 and isinstance(rec["z"], float)


def test_classify_clips_of_a_long_file(capsys, demo_csv, tmp_path):
    from wavetrain.data.demo import machine_sound

    clip_model = tmp_path / "clip.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=4",
                 "--clip-ms", "500", "-o", str(clip_model)]) == 0
    capsys.readouterr()
    x = np.concatenate([machine_sound("healthy", seconds=1.0, rng=np.random.default_rng(1)),
                        machine_sound("bearing", seconds=1.0, rng=np.random.default_rng(2))])
    sf.write(tmp_path / "long.wav", x, 16000)
    code, out, _ = run(capsys, "classify", "-m", str(clip_model), str(tmp_path / "long.wav"))
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 4
    assert [ln.split(":")[0].split("[")[1] for ln in lines] == ["0-500]", "500-1000]", "1000-1500]", "1500-2000]"]


def test_evaluate_kfold_json(capsys, demo_csv):
    code, out, err = run(capsys, "evaluate", "--data", str(demo_csv), "--label", "state", "--model", "gmm",
                         "--set", "components=4", "--folds", "2", "--group-by", "machine", "--json")
    assert code == 0
    res = json.loads(out)
    assert {"accuracy", "macro_f1", "confusion"} <= set(res)
    assert res["accuracy"] > 0.8 and len(res["folds"]) == 2
    assert np.asarray(res["confusion"]).sum() == 24


def test_evaluate_trained_model_with_cm(capsys, demo_csv, model_file):
    code, out, _ = run(capsys, "evaluate", "-m", str(model_file), "--data", str(demo_csv), "--label", "state", "--cm")
    assert code == 0 and "accuracy" in out and "confusion (rows: true" in out and "macro mean" in out


def test_info_data_and_model(capsys, demo_csv, model_file):
    code, out, _ = run(capsys, "info", str(demo_csv))
    assert code == 0 and "24 recordings" in out and "label state: 3 values" in out
    code, out, _ = run(capsys, "info", str(model_file))
    assert code == 0 and "model      gmm" in out and "bearing" in out


def test_models_lists_every_parameter(capsys):
    code, out, _ = run(capsys, "models", "gmm", "--json")
    (gmm,) = json.loads(out)
    names = {p["name"] for p in gmm["parameters"]}
    assert {"components", "features", "clip_ms", "unknown_sd"} <= names
    assert all(p["doc"] for p in gmm["parameters"])


def test_toml_model_spec(capsys, demo_csv, tmp_path):
    spec = tmp_path / "small.toml"
    spec.write_text('model = "gmm"\ncomponents = 2\nfeatures = "mfcc(coeffs=8)"\n')
    code, out, err = run(capsys, "train", "--data", str(demo_csv), "--label", "state", "--model", str(spec),
                         "-o", str(tmp_path / "s.wt"))
    assert code == 0, err
    code, out, _ = run(capsys, "info", "--json", str(tmp_path / "s.wt"))
    assert json.loads(out)["params"]["components"] == 2


@pytest.mark.parametrize("argv,message", [
    (["train", "--data", "NOPE", "--label", "x", "--model", "gmm", "-o", "m.wt"], "NOPE: no such file or folder"),
    (["train", "--data", "{csv}", "--label", "colour", "--model", "gmm", "-o", "m.wt"], "no label named 'colour'"),
    (["train", "--data", "{csv}", "--label", "state", "--model", "gmm", "--set", "components=0", "-o", "m.wt"],
     "gmm.components: expected an integer in [1, 1024], got 0"),
    (["train", "--data", "{csv}", "--label", "state", "--model", "gmm", "--set", "colour=red", "-o", "m.wt"],
     "gmm: unknown parameter 'colour'"),
    (["train", "--data", "{csv}", "--label", "state", "--model", "forest", "-o", "m.wt"], "unknown model 'forest'"),
    (["classify", "-m", "missing.wt", "x.wav"], "missing.wt: model file not found"),
])
def test_user_errors_are_one_line_exit_2(capsys, demo_csv, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{csv}", str(demo_csv)) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_audio_and_skip_bad(capsys, demo_csv, tmp_path, model_file):
    good = sorted(demo_csv.parent.glob("*.wav"))[:2]
    bad = tmp_path / "broken.wav"
    bad.write_bytes(good[0].read_bytes()[:3000])
    code, out, err = run(capsys, "classify", "-m", str(model_file), str(good[0]), str(bad))
    assert code == 2 and "broken.wav: truncated" in err
    code, out, err = run(capsys, "classify", "-m", str(model_file), "--skip-bad", str(good[0]), str(bad), str(good[1]))
    assert code == 0 and len(out.strip().splitlines()) == 2 and "skipped 1 bad recording:" in err


def test_model_file_is_not_a_pickle(capsys, tmp_path):
    evil = tmp_path / "evil.wt"
    evil.write_bytes(b"\x80\x04\x95not a zip")
    code, _, err = run(capsys, "info", str(evil))
    assert code == 2 and "not a readable wavetrain model" in err


def test_console_script_entry_point(demo_csv):
    out = subprocess.run([sys.executable, "-m", "wavetrain.cli.main", "info", str(demo_csv / "nope.csv")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("wavetrain: error:")


def test_preset_spec_sets_its_parameters(capsys, demo_csv, tmp_path):
    code, out, _ = run(capsys, "models", "--json")
    presets = {m["name"]: m for m in json.loads(out)}
    assert presets["gmm-speech"]["family"] == "gmm"
    out_file = tmp_path / "p.wt"
    code, _, err = run(capsys, "train", "--data", str(demo_csv), "--label", "state", "--model", "gmm-speech",
                       "--set", "components=2", "-o", str(out_file))
    assert code == 0, err
    run(capsys, "info", "--json", str(out_file))
    code, out, _ = run(capsys, "info", "--json", str(out_file))
    params = json.loads(out)["params"]
    assert params["components"] == 2 and "normalize(axis=time" in params["features"]


def test_skip_bad_counts_each_bad_recording_once_and_extracts_once(capsys, demo_csv, tmp_path):
    wavs = sorted(demo_csv.parent.glob("*.wav"))
    short = tmp_path / "short.wav"
    sf.write(short, np.zeros(80, np.float32), 16000)
    lines = [f"{w},state={w.name.split('_')[0]}" for w in wavs[::4][:6]] + [f"{short},state=healthy"]
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    code, out, err = run(capsys, "train", "--data", str(tmp_path / "m.csv"), "--label", "state", "--model", "gmm",
                         "--set", "components=2", "--no-cache", "--skip-bad", "-o", str(tmp_path / "m.wt"))
    assert code == 0, err
    assert "trained gmm on 6 recordings" in out
    assert "skipped 1 bad recording:" in err and "features: 6 extractions," in err


def test_version_reports_fft_backend_and_threads(capsys, monkeypatch):
    monkeypatch.setenv("WAVETRAIN_FFT", "scipy")
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("wavetrain ") and "FFT backend: scipy" in out and "compute threads: 1" in out
