"""The ``autoencoder`` anomaly detector (DCASE baseline): it learns, scores an obvious anomaly
higher, keeps its scores through a model file, resumes exactly, stays within its memory bound and
runs end to end from the command line."""
import tracemalloc

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import main
from wavetrain.evaluation.detection_metrics import roc_auc
from wavetrain.models import build, load_model, save_model
from wavetrain.models.autoencoder import build_autoencoder, n_weights, stack_frames, vector_count
from wavetrain.models.base import FitOptions
from wavetrain.train import HaltAfter
from wavetrain.train.array_stream import ArrayStream
from wavetrain.train.checkpoint import load_checkpoint

BANDS = 12
SMALL = {"stack": 3, "hidden": 32, "bottleneck": 4, "layers": 2, "batch_size": 64, "lr": 3e-3, "device": "cpu"}


def _windows(n, rng, *, anomalous=False, frames=(30, 40)):
    """Windows whose frames mix two fixed spectral shapes (a low-dimensional normal sound); an
    anomalous window adds a third shape the normal data never holds."""
    k = np.arange(BANDS)
    shapes = np.stack([np.exp(-0.5 * ((k - 3) / 1.5) ** 2), np.exp(-0.5 * ((k - 8) / 1.0) ** 2),
                       np.exp(-0.5 * ((k - 5.5) / 0.8) ** 2)])
    out = []
    for _ in range(n):
        t = int(rng.integers(*frames))
        w = rng.uniform(0.5, 2.0, (t, 2))
        g = w @ shapes[:2] + 0.05 * rng.normal(size=(t, BANDS))
        if anomalous:
            g += rng.uniform(1.0, 2.0, (t, 1)) * shapes[2]
        out.append(g.astype(np.float32))
    return out


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return _windows(40, rng), _windows(20, rng), _windows(20, rng, anomalous=True)


def _stream(grams, batch_size=8):
    return ArrayStream(grams, [0] * len(grams), ["normal"], batch_size=batch_size)


@pytest.fixture(scope="module")
def fitted(data):
    train, _, _ = data
    return build("autoencoder", dict(SMALL, epochs=30)).fit(_stream(train))


def test_defaults_are_the_dcase_baseline():
    m = build("autoencoder")
    p = m.get_params()
    assert (p["stack"], p["hidden"], p["bottleneck"], p["layers"]) == (5, 128, 8, 4)
    assert (p["epochs"], p["batch_size"], p["lr"]) == (100, 512, 1e-3)
    assert (p["optimizer"], p["schedule"]) == ("adam", "constant")
    assert m.feature_spec.feature_dim(16000) == 128 and m.detector and m.runtime_imports == ("torch",)
    net = build_autoencoder(640, 128, 8, 4)
    dense = [mod.out_features for mod in net if type(mod).__name__ == "Linear"]
    assert dense == [128, 128, 128, 128, 8, 128, 128, 128, 128, 640]
    assert sum(type(mod).__name__ == "BatchNorm1d" for mod in net) == 9
    assert n_weights(640, 128, 8, 4) == sum(t.numel() for t in net.parameters())


def test_stack_frames():
    g = np.arange(20, dtype=np.float32).reshape(5, 4)
    v = stack_frames(g, np.zeros(4, np.float32), np.ones(4, np.float32), 3)
    assert v.shape == (3, 12) == (vector_count(5, 3), 12)
    np.testing.assert_array_equal(v[1], g[1:4].ravel())
    short = stack_frames(g[:1], np.zeros(4, np.float32), np.full(4, 2, np.float32), 3)
    np.testing.assert_array_equal(short, np.tile(g[0] / 2, 3)[None])


def test_reconstruction_error_falls(fitted):
    losses = [h["train_loss"] for h in fitted.history_]
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0] and losses[-1] < min(losses[:5])
    assert fitted.train_info_["stop_reason"].startswith("maximum epochs")



def test_trains_on_every_stacked_vector_of_the_kept_recordings(fitted, data):
    # the detector holds out valid_fraction=0.2 of the recordings (seed 0) to set its threshold
    train, _ = _stream(data[0]).split_validation(0.2, 0)
    assert fitted.train_info_["vectors"] == sum(vector_count(g.shape[0], 3) for g in train.grams)


def test_obvious_anomaly_scores_higher(fitted, data):
    _, normal, anomalous = data
    s = fitted.anomaly_score(normal + anomalous)
    y = np.r_[np.zeros(len(normal)), np.ones(len(anomalous))]
    assert roc_auc(y, s) >= 0.9
    names = fitted.predict(normal + anomalous)
    assert np.mean([n == "anomaly" for n in names[len(normal):]]) >= 0.8
    assert np.mean([n == "normal" for n in names[:len(normal)]]) >= 0.7


def test_training_beats_the_untrained_network(data):
    """An untrained autoencoder's scores do not separate what a trained one does."""
    train, normal, anomalous = data
    y = np.r_[np.zeros(len(normal)), np.ones(len(anomalous))]
    trained = build("autoencoder", dict(SMALL, epochs=30)).fit(_stream(train))
    barely = build("autoencoder", dict(SMALL, epochs=1, batch_size=512)).fit(_stream(train))
    mse = lambda m: float(np.mean(m.anomaly_score(normal)))  # noqa: E731
    assert mse(trained) < 0.5 * mse(barely)
    assert roc_auc(y, trained.anomaly_score(normal + anomalous)) >= roc_auc(y, barely.anomaly_score(normal + anomalous))


def test_save_load_keeps_scores(fitted, data, tmp_path):
    _, normal, anomalous = data
    again = load_model(save_model(fitted, tmp_path / "ae.wt"))
    np.testing.assert_allclose(again.anomaly_score(normal + anomalous), fitted.anomaly_score(normal + anomalous),
                               rtol=1e-6)
    assert again.threshold_ == fitted.threshold_ and again.predict(anomalous) == fitted.predict(anomalous)
    state = fitted.state_dict()
    assert {"norm.mean", "norm.sd", "threshold"} <= state.keys()
    assert all(np.issubdtype(v.dtype, np.floating) for k, v in state.items() if not k.endswith("num_batches_tracked"))


def test_windows_of_any_length_and_in_any_batch(fitted, data):
    _, normal, _ = data
    batch = fitted.anomaly_score(normal[:6] + [normal[0][:1], normal[0][:2]])
    single = np.array([fitted.anomaly_score([g])[0] for g in normal[:6] + [normal[0][:1], normal[0][:2]]])
    np.testing.assert_allclose(batch, single, rtol=1e-5)
    assert np.isfinite(batch).all()


def test_resume_after_kill_gives_same_weights(data, tmp_path):
    train = data[0][:20]
    params = dict(SMALL, epochs=3, batch_size=32)   # 16 training windows -> 16*(30..39-2) vectors: ~16 steps/epoch
    full = build("autoencoder", params).fit(_stream(train))
    ck = tmp_path / "ck"
    halted = build("autoencoder", params).fit(_stream(train), options=FitOptions(checkpoint=str(ck),
                                                                                 callbacks=(HaltAfter(20),)))
    assert halted.train_info_["halted"]
    assert 0 < load_checkpoint(ck)["epoch"] < 3
    resumed = build("autoencoder", params).fit(_stream(train), options=FitOptions(checkpoint=str(ck), resume=str(ck)))
    a, b = full.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_memory_estimate_is_bounded_by_the_shuffle_buffer():
    m = build("autoencoder", {"shuffle_buffer": 4096})
    small = m.memory_estimate(128, 1, batch_frames=2000, total_frames=1000, window_frames=63)
    huge = m.memory_estimate(128, 1, batch_frames=2000, total_frames=10**9, window_frames=63)
    bigger_buffer = build("autoencoder", {"shuffle_buffer": 65536}).memory_estimate(
        128, 1, batch_frames=2000, total_frames=10**9, window_frames=63)
    assert small < huge < 200 << 20          # the data's size adds at most the shuffle buffer
    assert huge - small <= 4096 * (640 * 4 + 200)
    assert bigger_buffer - huge >= (65536 - 4096) * 640 * 4


def test_training_memory_does_not_grow_with_the_data():
    """numpy allocations while fitting (tracemalloc): the shuffle buffer and batches are bounded,
    so four times the data costs no more memory."""
    rng = np.random.default_rng(1)
    params = dict(SMALL, epochs=1, shuffle_buffer=256, valid_fraction=0.0)
    peaks = []
    for n in (40, 160):
        stream = _stream(_windows(n, rng, frames=(60, 61)), batch_size=4)
        tracemalloc.start()
        build("autoencoder", params).fit(stream)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    vector = 3 * BANDS * 4
    assert peaks[1] < peaks[0] * 1.3 + 200 * vector, peaks
    assert peaks[1] < 160 * 58 * vector, peaks   # less than the training vectors


def test_cli_end_to_end(tmp_path, capsys):
    """train on generated normal machine sounds, evaluate (AUC) and classify from the command line."""
    from wavetrain.data.demo import machine_sound

    rng = np.random.default_rng(0)
    rows = []
    for split, n_normal, n_anomaly in (("train", 16, 0), ("test", 8, 8)):
        for i in range(n_normal + n_anomaly):
            state = "normal" if i < n_normal else "anomaly"
            name = f"{split}_{i:02d}.wav"
            x = machine_sound("healthy" if state == "normal" else "bearing", seconds=1.0, rng=rng,
                              shaft_hz=float(rng.uniform(24, 26)))
            sf.write(tmp_path / name, x, 16000)
            rows.append(f"{name},state={state};split={split},\n")
    (tmp_path / "metadata.csv").write_text("".join(rows))
    model = tmp_path / "ae.wt"
    data = ["--data", str(tmp_path), "--label", "state"]
    sets = ["--set", "epochs=20", "--set", "features=logmel(bands=32, window_ms=64)", "--set", "hidden=32",
            "--set", "batch_size=64"]
    assert main(["train", *data, "--where", "split=train", "--model", "autoencoder", *sets, "-o", str(model),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "trained autoencoder on 16 normal recordings" in out
    assert main(["evaluate", "-m", str(model), *data, "--where", "split=test", "--no-progress"]) == 0
    out = capsys.readouterr().out
    auc = float(out.split("AUC")[1].split()[0])
    assert auc >= 0.9, out
    assert main(["classify", "-m", str(model), str(tmp_path / "test_00.wav")]) == 0
    assert "score=" in capsys.readouterr().out
