"""A trained wavetrain network as a feature extractor (``embedding(model=PATH.wt)``): its frames are
the network's penultimate activations of each of its windows (an autoencoder's bottleneck), they
stream in blocks as the whole recording, detectors train on them end to end (train, evaluate,
classify, an exported graph that agrees with the model), they are keyed by the model file's bytes
(a changed file is refused), and a model without a network is refused in one line. Also
``onnx(graphs=..., input=SPEC)``: a user's network that reads log-mel frames."""
from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
sf = pytest.importorskip("soundfile")

from wavetrain.cli.main import main  # noqa: E402
from wavetrain.core.errors import ModelFileError, SpecError  # noqa: E402
from wavetrain.core.graph import FLOAT, Graph  # noqa: E402
from wavetrain.features import extract, extract_blocks, parse_spec  # noqa: E402
from wavetrain.features.graph import spec_graph  # noqa: E402
from wavetrain.models import load_model, save_model  # noqa: E402
from wavetrain.models.autoencoder import stack_frames  # noqa: E402
from wavetrain.stream.windows import Windowing  # noqa: E402

RATE = 16000
#: Each section's fundamental (Hz): units of one design, slightly apart.
SECTIONS = {"s0": 400.0, "s1": 430.0, "s2": 465.0}


def _clip(rng: np.random.Generator, f0: float, seconds: float = 1.0, anomaly: bool = False) -> np.ndarray:
    """A machine-like tone: three harmonics of ``f0`` (drawn within 1%) in noise; an anomalous
    one has a rattle (a pulsed component at 2.6 f0)."""
    t = np.arange(int(RATE * seconds)) / RATE
    f = f0 * rng.uniform(0.99, 1.01)
    x = sum(np.sin(2 * np.pi * k * f * t + rng.uniform(0, 2 * np.pi)) / k for k in (1, 2, 3))
    if anomaly:
        x = x + 0.8 * np.sin(2 * np.pi * 2.6 * f * t) * (np.sin(2 * np.pi * 5 * t) > 0)
    return (0.2 * x + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Three sections: 8 normal training clips each, 3 normal and 3 anomalous test clips each."""
    folder = tmp_path_factory.mktemp("sections")
    rng = np.random.default_rng(0)
    rows = []
    for section, f0 in SECTIONS.items():
        for i in range(8):
            name = f"{section}_train_{i}.wav"
            sf.write(folder / name, _clip(rng, f0), RATE)
            rows.append(f"{name},section={section};state=normal;split=train,")
        for i in range(3):
            for state in ("normal", "anomaly"):
                name = f"{section}_test_{state}_{i}.wav"
                sf.write(folder / name, _clip(rng, f0, anomaly=state == "anomaly"), RATE)
                rows.append(f"{name},section={section};state={state};split=test,")
    (folder / "metadata.csv").write_text("\n".join(rows) + "\n")
    return folder


_NETS = {
    "cnn": ("--label", "section", "--model", "cnn", "--set", "epochs=4", "--clip-ms", "500", "--clip-shift-ms",
            "240"),
    # (each window normalised by its level and the smooth shape of its mean spectrum first)
    "cnn-channel": ("--label", "section", "--model", "cnn", "--set", "input_norm=channel", "--set", "epochs=1",
                    "--clip-ms", "500", "--clip-shift-ms", "240"),
    "dcase": ("--label", "section", "--model", "dcase", "--set", "epochs=2", "--clip-ms", "500", "--clip-shift-ms",
              "240"),
    # (whole recordings: it embeds one stacked vector of 3 frames every frame)
    "autoencoder": ("--label", "state", "--model", "autoencoder", "--set", "stack=3", "--set", "hidden=16", "--set",
                    "bottleneck=4", "--set", "layers=1", "--set", "epochs=2", "--set", "batch_size=64"),
}


@pytest.fixture(scope="module")
def nets(data, tmp_path_factory):
    """Networks trained on the sections (the autoencoder on their normal sound), once per module."""
    folder = tmp_path_factory.mktemp("nets")
    made: dict[str, Path] = {}

    def net(name: str) -> Path:
        if name not in made:
            path = folder / f"{name}.wt"
            assert main(["train", "--data", str(data), "--where", "split=train", *_NETS[name], "--set",
                         "features=logmel(bands=32)", "--set", "seed=0", "-o", str(path)]) == 0
            made[name] = path
        return made[name]

    return net


def _recording(data: Path, name: str) -> np.ndarray:
    x, rate = sf.read(data / name, dtype="float32")
    assert rate == RATE
    return x


def _windows(model, x: np.ndarray) -> list[np.ndarray]:
    """The model's own windows of ``x`` (its features cut by its clip settings), those that fit."""
    spec = model.feature_spec
    gram = extract(x, RATE, spec)
    windowing = Windowing.from_params(model.params)
    return [windowing.cut(gram, span) for span in windowing.spans(gram.shape[0], spec.frame_shift_s(RATE))
            if span[1] <= gram.shape[0]]


@pytest.mark.parametrize("net", ["cnn", "cnn-channel", "dcase"])
def test_embeddings_are_the_networks_penultimate_activations(nets, data, net):
    path = nets(net)
    model = load_model(path)
    spec = parse_spec(f"embedding(model='{path}')")
    assert spec.extractor.layer == "penultimate" and spec.rate == RATE
    assert parse_spec(str(spec)) == spec and "model_sha=" in str(spec)
    x = np.concatenate([_recording(data, "s1_train_0.wav"), _recording(data, "s1_train_1.wav")])
    got = extract(x, RATE, spec)
    wins = _windows(model, x)
    with torch.no_grad():
        want = model.net_[:-1](torch.from_numpy(model.prepare(wins))).numpy()
    # 2 s: 99 frames of 20 ms, windows of 25 frames (500 ms) every 12 (240 ms)
    assert got.shape == want.shape == (7, {"cnn": 64, "dcase": 128}[model.name])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert spec.frame_shift_s(RATE) == pytest.approx(0.24) and spec.feature_dim(RATE) == want.shape[1]
    assert spec.n_frames(x.size, RATE) == 7
    # exported: the same frames from a graph of the samples
    g = Graph()
    g.output("features", spec_graph(g, "audio", spec, RATE))
    graph = g.model([("audio", FLOAT, ["n"])], [("features", FLOAT, ["frames", want.shape[1]])])
    sess = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"audio": x})[0], got, atol=1e-4, rtol=1e-4)


def test_the_autoencoder_embeds_at_its_bottleneck(nets, data):
    path = nets("autoencoder")
    model = load_model(path)
    spec = parse_spec(f"embedding(model='{path}')")
    assert spec.extractor.layer == "bottleneck" and spec.feature_dim(RATE) == 4
    x = _recording(data, "s2_train_3.wav")
    got = extract(x, RATE, spec)
    gram = extract(x, RATE, model.feature_spec)
    vectors = np.concatenate([stack_frames(gram[i:i + 3], model.norm_mean_, model.norm_sd_, 3)
                              for i in range(gram.shape[0] - 2)])
    with torch.no_grad():
        want = model.net_[:6](torch.from_numpy(vectors)).numpy()          # dense, batch-norm, ReLU: to the bottleneck
    assert got.shape == want.shape == (gram.shape[0] - 2, 4)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    last = parse_spec(f"embedding(model='{path}', layer=penultimate)")
    assert extract(x, RATE, last).shape == (gram.shape[0] - 2, 16)
    with pytest.raises(SpecError, match="embeds at bottleneck, penultimate, not output"):
        parse_spec(f"embedding(model='{path}', layer=output)")


def test_a_model_path_needs_no_quotes(nets, monkeypatch):
    path = nets("cnn")
    monkeypatch.chdir(path.parent)
    spec = parse_spec("embedding(model=cnn.wt)")
    assert spec.extractor.model == "cnn.wt" and spec == parse_spec("embedding(model='cnn.wt')")
    assert parse_spec(f"embedding(model={path})").extractor.model == str(path)
    with pytest.raises(SpecError, match="Cnn.wt does not exist"):     # (kept as written, capitals too)
        parse_spec("embedding(model=./Cnn.wt)")


def test_blocks_and_batches_equal_the_whole_recording(nets, data):
    path = nets("cnn")
    spec = parse_spec(f"embedding(model='{path}')")
    x = np.concatenate([_recording(data, f"s0_train_{i}.wav") for i in range(8)])           # 8 s
    whole = extract(x, RATE, spec)
    blocks = extract_blocks(lambda a, b: x[a:b], x.size, RATE, spec, block_s=1.3)
    assert blocks is not None and blocks.shape == whole.shape == (32, 64)
    np.testing.assert_allclose(blocks, whole, atol=1e-5)
    both = extract(np.stack([x[:20000], x[8000:28000]]), RATE, spec)
    np.testing.assert_allclose(both[1], extract(x[8000:28000], RATE, spec), atol=1e-5)
    # a clip shorter than one window (25 frames of 20 ms: 8,320 samples) is zero-padded at its end to one
    short = x[:3000]
    padded = np.pad(short, (0, 8320 - 3000))
    assert spec.n_frames(3000, RATE) == spec.n_frames(8320, RATE) == 1
    np.testing.assert_allclose(extract(short, RATE, spec), extract(padded, RATE, spec), atol=1e-6)


@pytest.mark.parametrize("detector", ["knn-anomaly", "normal-dist"])
def test_a_detector_on_embeddings_end_to_end(nets, data, tmp_path, capsys, detector):
    net = nets("cnn")
    det = tmp_path / "det.wt"
    code, out, err = _run(capsys, "train", "--data", data, "--where", "split=train", "--label", "state", "--model",
                          detector, "--set", f"features=embedding(model={net})", "-o", det)
    assert code == 0, err
    # the model keeps the features with the network's digest
    assert "model_sha=" in load_model(det).params["features"]
    code, out, err = _run(capsys, "evaluate", "-m", det, "--data", data, "--where", "split=test", "--label", "state",
                          "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["windows"] == 18 and 0.0 <= res["auc"] <= 1.0
    if detector == "knn-anomaly":     # the nearest normal embeddings tell the rattle apart
        assert res["auc"] > 0.8, res["auc"]
    code, out, err = _run(capsys, "classify", "-m", det, data / "s1_test_anomaly_0.wav", data / "s1_test_normal_0.wav")
    assert code == 0 and len(out.strip().splitlines()) == 2 and "threshold=" in out, err
    code, out, err = _run(capsys, "export", "-m", det, "-o", tmp_path / "det.onnx", "--check", data)
    assert code == 0, err
    m = re.search(r"check: (\d+) windows, same answer on (\d+) .* at most ([0-9.e+-]+) relative", out + err)
    assert m and m.group(1) == m.group(2) == "42" and float(m.group(3)) < 1e-3, out + err


def test_a_changed_model_file_is_refused(nets, data, tmp_path):
    net = tmp_path / "net.wt"
    shutil.copy(nets("cnn"), net)
    spec = parse_spec(f"embedding(model='{net}')")
    code = main(["train", "--data", str(data), "--where", "split=train", "--label", "state", "--model",
                 "normal-dist", "--set", f"features=embedding(model={net})", "-o", str(tmp_path / "det.wt")])
    assert code == 0
    model = load_model(net)
    first = next(iter(model.net_.parameters()))
    with torch.no_grad():
        first.add_(0.01)
    save_model(model, net)
    with pytest.raises(SpecError, match=r"\(sha [0-9a-f]{16}\) differs from the one these features were made with"):
        parse_spec(str(spec))
    assert parse_spec(f"embedding(model='{net}')").key != spec.key
    with pytest.raises(ModelFileError, match="differs from the one these features were made with"):
        load_model(tmp_path / "det.wt")


def test_a_model_without_a_network_is_refused_in_one_line(data, tmp_path, capsys):
    plain = tmp_path / "plain.wt"
    code, _, err = _run(capsys, "train", "--data", data, "--where", "split=train", "--label", "state", "--model",
                        "normal-dist", "--set", "features=logmel(bands=16)", "-o", plain)
    assert code == 0, err
    code, _, err = _run(capsys, "train", "--data", data, "--where", "split=train", "--label", "state", "--model",
                        "knn-anomaly", "--set", f"features=embedding(model={plain})", "-o", tmp_path / "x.wt")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "is a normal-dist model, which has no network to embed with; give a model of cnn, dcase, rescnn, " \
           "autoencoder" in err
    with pytest.raises(SpecError, match="does not exist"):
        parse_spec(f"embedding(model='{tmp_path / 'none.wt'}')")
    (tmp_path / "net.onnx").write_bytes(b"x")
    with pytest.raises(SpecError, match=r"is not a model file \(\.wt\); an ONNX network is an extractor through onnx"):
        parse_spec(f"embedding(model='{tmp_path / 'net.onnx'}')")
    with pytest.raises(SpecError, match="the model sets the window and step"):
        parse_spec(f"embedding(model='{plain}', window_ms=20)")


# ---- onnx(..., input=SPEC): a user's network on log-mel frames -----------------------------------
class _LogMelNet(torch.nn.Module):
    """A PANNs-like network on log-mel windows ``(n, 1, frames, 64)`` of any length: a convolution,
    the maximum over time (``h``, 256 values), a dense layer to 16 (``y``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.out = torch.nn.Linear(4 * 64, 16)

    def forward(self, x):
        h = torch.relu(self.conv(x)).amax(dim=2).flatten(1)
        return self.out(h), h


def test_an_onnx_network_reads_log_mel_frames(tmp_path):
    torch.manual_seed(0)
    net = _LogMelNet().eval()
    path = tmp_path / "logmel_net.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # (the TorchScript exporter is marked deprecated)
        torch.onnx.export(net, (torch.zeros(1, 1, 25, 64),), str(path), dynamo=False, input_names=["x"],
                          output_names=["y", "h"], dynamic_axes={"x": {0: "n", 2: "frames"}, "y": {0: "n"},
                                                                 "h": {0: "n"}}, opset_version=17)
    spec = parse_spec(f"onnx(graphs='{path}', input='logmel(bands=64)', windows='25', steps='10', pad_s=0)")
    assert parse_spec(str(spec)) == spec and "input='logmel(bands=64, " in str(spec)
    x = (0.1 * np.random.default_rng(0).standard_normal(RATE * 3)).astype(np.float32)
    got = extract(x, RATE, spec)
    mel = extract(x, RATE, "logmel(bands=64)")
    wins = np.stack([mel[i:i + 25] for i in range(0, mel.shape[0] - 24, 10)])
    with torch.no_grad():
        want, hidden = (v.numpy() for v in net(torch.from_numpy(wins[:, None])))
    assert got.shape == want.shape == (13, 16)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert spec.frame_shift_s(RATE) == pytest.approx(0.2)
    blocks = extract_blocks(lambda a, b: x[a:b], x.size, RATE, spec, block_s=0.7)
    assert blocks is not None
    np.testing.assert_allclose(blocks, got, atol=1e-5)
    g = Graph(18)
    g.output("features", spec_graph(g, "audio", spec, RATE))
    graph = g.model([("audio", FLOAT, ["n"])], [("features", FLOAT, ["frames", 16])])
    sess = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"audio": x})[0], got, atol=1e-4, rtol=1e-4)
    # output= names the graph's value taken (here its second output, before the dense layer)
    inner = parse_spec(f"onnx(graphs='{path}', input='logmel(bands=64)', windows='25', steps='10', pad_s=0, "
                       "output=h)")
    np.testing.assert_allclose(extract(x, RATE, inner), hidden, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("front, message", [
    ("logmel(bands=64) | delta", "look across frames"),
    ("logmel(bands=64) | normalize", "look across frames"),
    ("logmel(bands=64, whole=true)", "no frame-by-frame front-end"),
    ("logmel(bands=64) + mfcc", "combines several extractors"),
    ("logmel(bands=64, rate=8000)", "computed at rate=8000"),
])
def test_a_front_end_that_is_not_frame_by_frame_is_refused(tmp_path, front, message):
    path = tmp_path / "net.onnx"
    path.write_bytes(b"")
    with pytest.raises(SpecError, match=message):
        parse_spec(f"onnx(graphs='{path}', input='{front}', windows='25', steps='10')")
