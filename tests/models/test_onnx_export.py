"""``wavetrain export``: every family's graph gives the model's own scores (to 1e-3 relative) and
answers on held-out recordings, other rates and lengths, very short clips and silence; the graph
loads as a model that ``classify`` and live classification run; the command's errors are one
line."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from wavetrain.cli.main import main  # noqa: E402
from wavetrain.core.errors import AudioError  # noqa: E402
from wavetrain.data.demo import make_demo_dataset  # noqa: E402
from wavetrain.models.modelfile import load_model  # noqa: E402
from wavetrain.pipeline.prediction import classify_samples, classify_stream  # noqa: E402

_DET = ["--label", "state", "--normal", "healthy", "--where", "state=healthy"]
#: Model name -> training arguments (small: the graphs, not the models, are under test).
MODELS = {
    "gmm": ["--model", "gmm", "--set", "components=2"],
    "gmm-clips": ["--model", "gmm", "--features", "mfcc(coeffs=13)", "--set", "components=2", "--clip-ms", "400",
                  "--clip-shift-ms", "200"],
    # deltas look across frames, and a last window is completed from its own frames: as live
    "gmm-live": ["--model", "gmm", "--set", "components=2", "--clip-ms", "400", "--set", "pad=duplicate"],
    "knn": ["--model", "knn", "--set", "unknown_distance=30"],
    "hmm": ["--model", "hmm", "--set", "states=3", "--set", "skip=true"],
    # the warp search: each warp's features side by side, the best one's scores and the warp
    "gmm-vtln": ["--model", "gmm", "--set", "components=2", "--set", "vtln=true", "--set", "vtln_warps=0.9,1.1"],
    "hmm-vtln": ["--model", "hmm", "--set", "states=3", "--set", "vtln=true", "--set", "vtln_warps=0.9:1.1:0.1"],
    "cnn": ["--model", "cnn", "--features", "logmel(bands=16)", "--set", "epochs=1", "--set", "batch_size=8",
            "--clip-ms", "500"],
    "dcase": ["--model", "dcase", "--features", "logmel(bands=16)", "--set", "epochs=1", "--set", "batch_size=8",
              "--set", "valid_fraction=0"],
    "rescnn": ["--model", "rescnn", "--features", "logmel(bands=16)", "--set", "epochs=1", "--set", "batch_size=8",
               "--set", "tta_crops=3", "--set", "valid_fraction=0"],
    "ensemble": ["--model", "ensemble", "--set", "members=gmm,knn", "--set", "combine=vote"],
    # members on two frame grids: the second sees each of its own (coarser) frames once
    "ensemble-grids": ["--model", "ensemble", "--set", 'members=[{"model": "gmm", "components": 2, "features": '
                       '"mfcc(coeffs=13, window_ms=25, shift_pct=40)"}, {"model": "knn", "features": '
                       '"logmel(bands=16, window_ms=50, shift_pct=50)"}]'],
    "normal-dist": ["--model", "normal-dist", *_DET],
    "anomaly-gmm": ["--model", "anomaly-gmm", "--features", "pcen(bands=16) | cmvn(window_frames=20)",
                    "--set", "components=2", *_DET],
    "knn-anomaly": ["--model", "knn-anomaly", "--set", "distance=l1", *_DET],
    "autoencoder": ["--model", "autoencoder", "--set", "epochs=1", *_DET],
}


@pytest.fixture(scope="module")
def exported(demo_csv, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """``{name: (model.wt, model.onnx)}`` trained on the demo data and exported."""
    folder = tmp_path_factory.mktemp("onnx")
    out = {}
    for name, args in MODELS.items():
        wt, graph = folder / f"{name}.wt", folder / f"{name}.onnx"
        if "--label" not in args:
            args = [*args, "--label", "state"]
        assert main(["train", "--data", str(demo_csv), *args, "-o", str(wt)]) == 0
        assert main(["export", "-m", str(wt), "-o", str(graph)]) == 0
        out[name] = (wt, graph)
    return out


@pytest.fixture(scope="module")
def held_out(tmp_path_factory) -> list[tuple[np.ndarray, int]]:
    """Recordings no model trained on: other noise and speed, 8 kHz and 44.1 kHz, 2.3 s, a clip of
    0.1 s, silence."""
    from wavetrain.data.audio import read_audio

    folder = tmp_path_factory.mktemp("held")
    csv = make_demo_dataset(folder, per_combo=1, speeds=(20.0,), snrs=(5.0,), seconds=2.3, seed=7)
    clips = [read_audio(p)[:2] for p in sorted(Path(csv).parent.glob("*.wav"))]
    x, rate = clips[0]
    from wavetrain.core.signal import resample

    clips.append((resample(x, rate, 8000), 8000))
    clips.append((resample(clips[1][0], rate, 44100), 44100))
    clips.append((x[:1600], rate))
    clips.append((np.zeros(rate, np.float32), rate))
    return clips


def _same(a, b, what: str) -> None:
    assert len(a) == len(b), what
    for p, q in zip(a, b):
        assert (p.start_ms, p.end_ms) == (q.start_ms, q.end_ms), what
        scale = max(1.0, float(np.max(np.abs(p.scores))))
        np.testing.assert_allclose(q.scores, p.scores, rtol=1e-3, atol=1e-5 * scale, err_msg=what)
        assert q.label == p.label, f"{what}: {q.label} != {p.label} ({p.scores} / {q.scores})"
        for k, v in p.details.items():
            assert q.details[k] == pytest.approx(v, rel=1e-3, abs=1e-5, nan_ok=True), f"{what}: {k}"


@pytest.mark.parametrize("name", [m for m in MODELS if m != "gmm-live"])
def test_graph_answers_as_the_model(exported, held_out, name):
    wt, graph = exported[name]
    model, onnx_model = load_model(wt), load_model(graph)
    assert onnx_model.fitted_labels == model.fitted_labels and onnx_model.score_kind == model.score_kind
    for i, (x, rate) in enumerate(held_out):
        _same(classify_samples(model, x, rate), classify_samples(onnx_model, x, rate), f"{name} clip {i}")


def test_every_initializer_is_read_by_a_node(exported):
    """No constant the graph does not use (onnxruntime warns about each one when it loads)."""
    from wavetrain.core.graph import _read_names

    for name, (_, graph) in exported.items():
        g = onnx.load(str(graph)).graph
        read = {n for node in g.node for n in _read_names(node)} | {o.name for o in g.output}
        assert [i.name for i in g.initializer if i.name not in read] == [], name


def test_metadata_is_the_contract(exported):
    wt, graph = exported["normal-dist"]
    model = load_model(wt)
    meta = {p.key: p.value for p in onnx.load(str(graph)).metadata_props}
    assert json.loads(meta["labels"]) == ["healthy"] and meta["score_kind"] == "anomaly"
    assert float(meta["threshold"]) == model.threshold_ and int(meta["rate"]) == 16000
    import hashlib

    assert meta["model_sha256"] == hashlib.sha256(wt.read_bytes()).hexdigest()
    assert meta["features"] == str(model.feature_spec) and meta["family"] == "normal-dist"
    sess = ort.InferenceSession(str(graph))
    assert [i.name for i in sess.get_inputs()] == ["audio"]
    assert [o.name for o in sess.get_outputs()][:2] == ["scores", "best"]
    knn = {p.key: p.value for p in onnx.load(str(exported["knn"][1])).metadata_props}
    assert json.loads(knn["unknown"]) == {"rule": "above", "output": "nearest", "value": 30.0}


def test_shorter_than_a_sub_window_is_refused_by_both(exported):
    wt, graph = exported["cnn"]
    for m in (load_model(wt), load_model(graph)):
        with pytest.raises(AudioError):
            classify_samples(m, np.zeros(100, np.float32), 16000)


def test_live_stream_equals_the_model_live(exported, held_out):
    """A clip model whose features look across frames (deltas) and whose last window is completed
    from its own frames: the graph sees a window's own frames, as wavetrain's live classification
    does (a file's windows differ there: see the export's notes)."""
    x, rate = held_out[0]
    blocks = [(x[i:i + 1000], 0.0) for i in range(0, len(x), 1000)]
    for name in ("gmm-live", "cnn"):
        wt, graph = exported[name]
        a = [w.prediction for w in classify_stream(load_model(wt), iter(blocks), rate)]
        b = [w.prediction for w in classify_stream(load_model(graph), iter(blocks), rate)]
        assert len(a) > 2
        _same(a, b, name)


def test_classify_with_the_graph_prints_what_the_model_prints(exported, demo_csv, capsys):
    wt, graph = exported["cnn"]
    outs = []
    for m in (wt, graph):
        capsys.readouterr()
        assert main(["classify", "-m", str(m), "--json", "--compare", "state", str(demo_csv)]) == 0
        outs.append([json.loads(line) for line in capsys.readouterr().out.splitlines()])
    assert len(outs[0]) == len(outs[1]) > 0
    for a, b in zip(*outs):
        keys = ("file", "start_ms", "value", "correct")
        assert [a[k] for k in keys] == [b[k] for k in keys]
        for v, s in a["scores"].items():
            assert b["scores"][v] == pytest.approx(s, rel=1e-3, abs=1e-5)


def test_quantized_network_is_smaller_and_reports_its_accuracy(exported, demo_csv, tmp_path, capsys):
    wt, graph = exported["cnn"]
    q = tmp_path / "cnn-int8.onnx"
    assert main(["export", "-m", str(wt), "-o", str(q), "--quantize", "int8", "--check", str(demo_csv)]) == 0
    err = capsys.readouterr().err
    assert "accuracy .wt" in err and "int8 graph" in err
    assert os.path.getsize(q) < os.path.getsize(graph)

    def network_bytes(path) -> int:
        return sum(i.ByteSize() for i in onnx.load(str(path)).graph.initializer if "/net/" in i.name)

    assert network_bytes(q) < 0.27 * network_bytes(graph)        # int8 weights, float32 scales and biases
    ops = {n.op_type for n in onnx.load(str(q)).graph.node}
    assert "DynamicQuantizeLinear" in ops or "MatMulInteger" in ops or "ConvInteger" in ops


def _error(capsys, *argv) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_export_errors_are_one_line(exported, tmp_path, capsys):
    wt, graph = exported["gmm"]
    bad = tmp_path / "bad.wt"
    bad.write_bytes(b"PK\x03\x04 not really a model")
    assert "bad.wt" in _error(capsys, "export", "-m", str(bad), "-o", str(tmp_path / "x.onnx"))
    assert ".onnx" in _error(capsys, "export", "-m", str(wt), "-o", str(tmp_path / "x.txt"))
    assert "folder" in _error(capsys, "export", "-m", str(wt), "-o", str(tmp_path))
    link = tmp_path / "link.onnx"
    link.symlink_to(tmp_path / "elsewhere.onnx")
    assert "symbolic link" in _error(capsys, "export", "-m", str(wt), "-o", str(link))
    assert not (tmp_path / "elsewhere.onnx").exists()
    assert "opset" in _error(capsys, "export", "-m", str(wt), "-o", str(tmp_path / "x.onnx"), "--opset", "99")
    assert "no network weights" in _error(capsys, "export", "-m", str(wt), "-o", str(tmp_path / "x.onnx"),
                                        "--quantize", "int8")
    assert "already" in _error(capsys, "export", "-m", str(graph), "-o", str(tmp_path / "y.onnx"))
    copy = tmp_path / "same.onnx"
    copy.write_bytes(graph.read_bytes())
    assert "is the input" in _error(capsys, "export", "-m", str(copy), "-o", str(copy))
    assert not (tmp_path / "x.onnx").exists()
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a graph")
    assert "junk.onnx" in _error(capsys, "classify", "-m", str(junk), str(tmp_path))


def test_unexportable_settings_are_named(demo_csv, tmp_path, capsys):
    wt = tmp_path / "adapt.wt"
    assert main(["train", "--data", str(demo_csv), "--model", "normal-dist", "--set", "adapt=10", *_DET,
                 "-o", str(wt)]) == 0
    assert "adapt" in _error(capsys, "export", "-m", str(wt), "-o", str(tmp_path / "a.onnx"))


@pytest.mark.parametrize("opset", [18, 20])
def test_other_opsets(exported, held_out, tmp_path, opset):
    for name in ("gmm", "cnn"):
        wt = exported[name][0]
        out = tmp_path / f"{name}-{opset}.onnx"
        assert main(["export", "-m", str(wt), "-o", str(out), "--opset", str(opset)]) == 0
        x, rate = held_out[0]
        _same(classify_samples(load_model(wt), x, rate), classify_samples(load_model(out), x, rate), name)


def test_example_script_answers_as_classify(exported, demo_csv, capsys):
    """examples/onnx_classify.py (numpy, soundfile and onnxruntime only) prints the windows and
    answers ``classify -m model.onnx`` gives."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "examples" / "onnx_classify.py"
    wav = sorted(Path(demo_csv).parent.glob("bearing_*.wav"))[0]
    check = ("import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__'); "
             "assert not [m for m in sys.modules if m.startswith('wavetrain')], 'imported wavetrain'")
    for name in ("cnn", "gmm-clips", "knn", "normal-dist"):
        graph = exported[name][1]
        out = subprocess.run([sys.executable, "-c", check, str(script), str(graph), str(wav)], capture_output=True,
                             text=True, check=True).stdout.splitlines()
        capsys.readouterr()
        assert main(["classify", "-m", str(graph), str(wav)]) == 0
        ours = capsys.readouterr().out.splitlines()
        assert len(out) == len(ours) > 0
        for a, b in zip(out, ours):
            assert a.split(":")[0] == b.split(":")[0]                       # file[start-end]
            value = b.split(": ", 1)[1].split()[0]                          # state=... or anomaly=true
            assert value in a or (value == "anomaly=true" and "=anomaly" in a) or \
                (value == "anomaly=false" and "=healthy" in a)
            # the score named as classify names it (loglik=, confidence=, score=)
            assert a.split(": ", 1)[1].split()[1].split("=")[0] == b.split(": ", 1)[1].split()[1].split("=")[0]


def test_serve_answers_with_the_graph(exported, demo_csv):
    """``serve -m model.onnx``: the answer's windows are the graph's (and the model's); a clip
    model asked for other windows is a 400."""
    pytest.importorskip("starlette")
    from tests.serve.conftest import asgi, multipart
    from wavetrain.data.audio import read_audio
    from wavetrain.serve import ModelService, ServeConfig, create_app

    wav = sorted(Path(demo_csv).parent.glob("loose_*.wav"))[0]
    body, ctype = multipart(wav.read_bytes())
    x, rate = read_audio(wav)[:2]
    for name in ("gmm", "cnn"):
        wt, graph = exported[name]
        app = create_app(ModelService.from_file(graph), ServeConfig())
        # (unknown=trained: the model's own answers; a server's default adds the family's unknown
        # rule, which a one-epoch cnn's low probabilities fall under)
        r = asgi(app, "POST", "/v1/classify?unknown=trained", body, {"content-type": ctype})
        assert r.status == 200, r.body
        res = r.json()
        expected = classify_samples(load_model(wt), x, rate)
        assert [s["label"] for s in res["segments"]] == [p.label for p in expected]
        assert res["model"]["id"] == graph.name
    r = asgi(app, "POST", "/v1/classify?clip_ms=250", body, {"content-type": ctype})
    assert r.status == 400 and b"500 ms" in r.body
