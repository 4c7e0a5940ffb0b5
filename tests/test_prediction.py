"""classify_samples: samples held in memory are classified exactly as a recording of them is."""
import numpy as np
import pytest
import soundfile as sf
from scipy.signal import resample_poly

from wavetrain.core.errors import AudioError
from wavetrain.data import load_dataset
from wavetrain.data.demo import machine_sound
from wavetrain.pipeline.jobs import RunOptions, prediction_stream, train_model
from wavetrain.pipeline.prediction import classify_samples, predict


@pytest.fixture(scope="module")
def clipped_model(demo_csv):
    model, _ = train_model(load_dataset(demo_csv), "state", "gmm",
                           {"components": 2, "clip_ms": 400, "clip_shift_ms": 300}, RunOptions())
    return model


def test_samples_give_the_same_windows_and_scores_as_a_file(clipped_model, tmp_path):
    x = np.concatenate([machine_sound("healthy", seconds=1.3, rng=np.random.default_rng(1)),
                        machine_sound("bearing", seconds=1.0, rng=np.random.default_rng(2))])
    sf.write(tmp_path / "x.wav", x, 16000, subtype="FLOAT")
    from_file = list(predict(clipped_model, prediction_stream(clipped_model, load_dataset(tmp_path / "x.wav"),
                                                              RunOptions())))
    from_samples = classify_samples(clipped_model, x, 16000)
    assert [(p.start_ms, p.end_ms, p.label) for p in from_samples] == \
           [(p.start_ms, p.end_ms, p.label) for p in from_file]
    for a, b in zip(from_samples, from_file):
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5)
        assert a.recording is None and a.file is None and a.name == "samples"
    assert from_samples[-1].end_ms == 2300          # the padded last window ends with the signal


def test_samples_at_another_rate_are_resampled_to_the_model(clipped_model):
    x = machine_sound("loose", seconds=2.0, rng=np.random.default_rng(3))
    at16 = classify_samples(clipped_model, x, 16000)
    at44 = classify_samples(clipped_model, resample_poly(x, 441, 160).astype(np.float32), 44100)
    assert [p.label for p in at44] == [p.label for p in at16]
    assert [(p.start_ms, p.end_ms) for p in at44] == [(p.start_ms, p.end_ms) for p in at16]


def test_multichannel_samples_are_averaged_and_bad_ones_refused(clipped_model):
    x = machine_sound("healthy", seconds=1.0, rng=np.random.default_rng(4))
    mono = classify_samples(clipped_model, x, 16000)
    stereo = classify_samples(clipped_model, np.stack([x, x], axis=1), 16000)
    assert [p.label for p in stereo] == [p.label for p in mono]
    with pytest.raises(AudioError, match="non-empty"):
        classify_samples(clipped_model, np.zeros(0, np.float32), 16000)
    with pytest.raises(AudioError, match="NaN"):
        classify_samples(clipped_model, np.full(16000, np.nan, np.float32), 16000)
    with pytest.raises(AudioError, match="sampled at 10 Hz"):
        classify_samples(clipped_model, np.zeros(100, np.float32), 10)


def test_clips_of_one_frame_features_are_refused_not_divided_by_zero():
    """A model whose features give one frame per recording cannot cut clips, however it was fitted."""
    from wavetrain.core.errors import ParameterError
    from wavetrain.models import build
    from wavetrain.train import ArrayStream

    rng = np.random.default_rng(0)
    model = build("gmm", {"components": 1, "features": "logmel(bands=8, window_ms=0)", "clip_ms": 500})
    model.fit(ArrayStream([rng.normal(size=(3, 8)).astype(np.float32) for _ in range(6)], [0, 1] * 3, ["a", "b"]))
    with pytest.raises(ParameterError, match="clip_ms=500: windows need framed features"):
        classify_samples(model, machine_sound("healthy", seconds=1.0, rng=np.random.default_rng(5)), 16000)


def test_confidence_is_given_only_for_probabilities():
    """A GMM's scores are log-likelihoods: no confidence is claimed for them; a probability's is its score."""
    from wavetrain.pipeline.prediction import Prediction

    gmm = Prediction(None, 0, 1000, "a", np.array([-40.0, -45.0]), "mean_loglik", ["a", "b"], {"z": -0.5})
    assert gmm.confidence is None and gmm.score == -40.0 and gmm.margin == 5.0
    assert "confidence" not in gmm.to_json("x") and "loglik=-40.0" in gmm.describe("x")
    nn = Prediction(None, 0, 1000, "b", np.array([0.2, 0.8]), "probability", ["a", "b"])
    assert nn.confidence == pytest.approx(0.8) and nn.to_json("x")["confidence"] == pytest.approx(0.8)
    assert nn.describe("x") == "x=b confidence=0.80"


def test_a_live_stream_owns_its_adapting_copy_of_the_model(demo_csv):
    """normal-dist with adapt=N learns while classifying: a stream adapts its own copy, so the
    loaded model is unchanged and a second stream starts from where training left it."""
    from wavetrain.pipeline.prediction import classify_stream

    model, _ = train_model(load_dataset(demo_csv), "state", "normal-dist",
                           {"adapt": 2, "clip_ms": 200, "features": "mfcc(bands=20, coeffs=8)"}, RunOptions(),
                           normal="healthy")
    still, _ = train_model(load_dataset(demo_csv), "state", "normal-dist",
                           {"clip_ms": 200, "features": "mfcc(bands=20, coeffs=8)"}, RunOptions(), normal="healthy")
    mean = model.mean_.copy()
    x = machine_sound("healthy", seconds=2.0, rng=np.random.default_rng(7))
    first = [w.prediction.score for w in classify_stream(model, [(x, 0.0)], 16000)]
    np.testing.assert_array_equal(model.mean_, mean)
    second = [w.prediction.score for w in classify_stream(model, [(x, 0.0)], 16000)]
    assert first == second
    fixed = [w.prediction.score for w in classify_stream(still, [(x, 0.0)], 16000)]
    assert first[0] == pytest.approx(fixed[0]) and first[1:] != pytest.approx(fixed[1:])   # it did adapt
