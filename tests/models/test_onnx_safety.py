"""Hostile ``.onnx`` files: graphs exported by ``wavetrain export`` and then edited by hand.

Every edit must end in a one-line :class:`ModelFileError` on load (the graph's contract: no data in
other files, one float32 input ``audio``, the outputs and metadata the exporter writes, a probe
whose outputs are finite and of the right shapes), or, for a graph that misbehaves only on some
clips, a one-line :class:`GraphRunError` at run time that leaves the model usable: a run never
hangs (a deadline), never takes the machine's memory (a bound), never prints NaN as an answer.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

from wavetrain.cli.main import main  # noqa: E402
from wavetrain.core.errors import ModelFileError  # noqa: E402
from wavetrain.models.modelfile import load_model  # noqa: E402
from wavetrain.models.onnx_model import GraphRunError  # noqa: E402

RATE = 16000
_DET = ["--label", "state", "--normal", "healthy", "--where", "state=healthy"]
#: Graph name -> training arguments: a classifier with a detail (z), one with an unknown rule
#: (knn: nearest above a distance), a detector (a threshold).
MODELS = {
    "gmm": ["--model", "gmm", "--set", "components=2", "--label", "state"],
    "knn": ["--model", "knn", "--set", "unknown_distance=30", "--label", "state"],
    "normal-dist": ["--model", "normal-dist", *_DET],
}


@pytest.fixture(scope="module")
def graphs(demo_csv, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("graphs")
    out = {}
    for name, args in MODELS.items():
        wt, graph = folder / f"{name}.wt", folder / f"{name}.onnx"
        assert main(["train", "--data", str(demo_csv), *args, "-o", str(wt)]) == 0
        assert main(["export", "-m", str(wt), "-o", str(graph)]) == 0
        out[name] = graph
    return out


@pytest.fixture(scope="module")
def loud_wav(tmp_path_factory) -> Path:
    import soundfile as sf

    path = tmp_path_factory.mktemp("loud") / "loud.wav"
    t = np.arange(RATE) / RATE
    sf.write(path, (0.6 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), RATE)
    return path


# -- editing a graph --------------------------------------------------------------------------------
def _proto(path: Path):
    return onnx.load(str(path))


def _save(proto, path: Path) -> Path:
    path.write_bytes(proto.SerializeToString())    # (as is: onnx.save would resolve external data)
    return path


def _meta(proto, **values) -> None:
    """Set (a string), or remove (None), metadata properties."""
    props = {p.key: p.value for p in proto.metadata_props}
    for k, v in values.items():
        if v is None:
            props.pop(k, None)
        else:
            props[k] = v
    del proto.metadata_props[:]
    for k, v in props.items():
        proto.metadata_props.add(key=k, value=v)


def _const(proto, name: str, value, dtype=TensorProto.FLOAT, dims=(1,)) -> str:
    values = list(np.ravel(value))
    proto.graph.initializer.append(helper.make_tensor(name, dtype, list(dims), values))
    return name


def _wrap(proto, output: str, build) -> None:
    """The graph's ``output`` becomes ``build(raw)``'s, ``raw`` being what the exporter computed."""
    raw = f"{output}_raw"
    for node in proto.graph.node:
        node.output[:] = [raw if o == output else o for o in node.output]
        node.input[:] = [raw if i == output else i for i in node.input]
    proto.graph.node.extend(build(raw))


def _add_to_scores(proto, build) -> None:
    """``scores`` plus 0 times ``build()``'s one value (a tensor of shape (1,)): a graph that
    answers as before whenever ``build`` ends."""
    zero = _const(proto, "zero_f", [0.0])

    def nodes(raw):
        extra, value = build()
        return [*extra, helper.make_node("Mul", [value, zero], ["nothing"]),
                helper.make_node("Add", [raw, "nothing"], ["scores"])]
    _wrap(proto, "scores", nodes)


def _loop(proto, trip_count: str):
    """A Loop of ``trip_count`` iterations (none given: forever) doing nothing; its result (1,)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["v"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])])
    _const(proto, "yes", [True], TensorProto.BOOL, ())
    _const(proto, "v0", [0.0])
    return [helper.make_node("Loop", [trip_count, "yes", "v0"], ["looped"], body=body)], "looped"


def _loud(proto) -> tuple[list, str]:
    """Nodes of ``max(audio) - 0.2`` (a scalar): positive for a loud clip only."""
    _const(proto, "loud_level", [0.2], dims=())
    return [helper.make_node("ReduceMax", ["audio"], ["peak"], keepdims=0),
            helper.make_node("Sub", ["peak", "loud_level"], ["over"])], "over"


def _hang_when_loud(proto) -> None:
    def build():
        nodes, over = _loud(proto)
        _const(proto, "many", [1e15], dims=())
        nodes += [helper.make_node("Relu", [over], ["over_pos"]),
                  helper.make_node("Mul", ["over_pos", "many"], ["n_f"]),
                  helper.make_node("Cast", ["n_f"], ["n"], to=TensorProto.INT64)]
        loop, out = _loop(proto, "n")
        return nodes + loop, out
    _add_to_scores(proto, build)


def _nan_when_loud(proto) -> None:
    def build():
        nodes, over = _loud(proto)
        _const(proto, "zero_s", [0.0], dims=())
        _const(proto, "nan_s", [math.nan], dims=())
        nodes += [helper.make_node("Greater", [over, "zero_s"], ["is_loud"]),
                  helper.make_node("Where", ["is_loud", "nan_s", "zero_s"], ["maybe_nan"]),
                  helper.make_node("Unsqueeze", ["maybe_nan", "axis0"], ["maybe_nan1"])]
        _const(proto, "axis0", [0], TensorProto.INT64)
        return nodes, "maybe_nan1"
    _wrap(proto, "scores", lambda raw: [*build()[0], helper.make_node("Add", [raw, "maybe_nan1"], ["scores"])])


def _constant_of_shape(proto, n: int, copies: int = 1) -> None:
    """``copies`` tensors of ``n`` float32 zeros (constant shapes), summed into the scores."""
    def build():
        _const(proto, "big_shape", [n], TensorProto.INT64)
        nodes, last = [], None
        for i in range(copies):
            value = helper.make_tensor("fill", TensorProto.FLOAT, [1], [float(i)])
            nodes += [helper.make_node("ConstantOfShape", ["big_shape"], [f"big{i}"], value=value),
                      helper.make_node("ReduceSum", [f"big{i}"], [f"big_sum{i}"], keepdims=1)]
            if last is not None:
                nodes.append(helper.make_node("Add", [last, f"big_sum{i}"], [f"acc{i}"]))
            last = f"acc{i}" if last is not None else f"big_sum{i}"
        return nodes, last
    _add_to_scores(proto, build)


def _rename_input(proto, name: str) -> None:
    def rename(graph):
        for node in graph.node:
            node.input[:] = [name if i == "audio" else i for i in node.input]
            for a in node.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    rename(g)
    rename(proto.graph)
    proto.graph.input[0].name = name


def _external(name: str, location: str, n: int = 4):
    """A float32 tensor of ``n`` values read from ``location``."""
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[n], data_location=TensorProto.EXTERNAL)
    for k, v in (("location", location), ("offset", "0"), ("length", str(4 * n))):
        t.external_data.add(key=k, value=v)
    return t


def _leak(proto, tensor) -> None:
    """The scores plus 0 times the sum of an initializer read from another file."""
    proto.graph.initializer.append(tensor)

    def build():
        return [helper.make_node("ReduceSum", [tensor.name], ["leak_sum"], keepdims=1)], "leak_sum"
    _add_to_scores(proto, build)


def _leak_in_constant(proto, tensor) -> None:
    def build():
        return [helper.make_node("Constant", [], ["leaked"], value=tensor),
                helper.make_node("ReduceSum", ["leaked"], ["leak_sum"], keepdims=1)], "leak_sum"
    _add_to_scores(proto, build)


def _leak_sparse(proto, tensor) -> None:
    idx = helper.make_tensor("leak_idx", TensorProto.INT64, [4], [0, 1, 2, 3])
    tensor.name = "leak_sparse"
    proto.graph.sparse_initializer.append(helper.make_sparse_tensor(tensor, idx, [4]))

    def build():
        return [helper.make_node("ReduceSum", ["leak_sparse"], ["leak_sum"], keepdims=1)], "leak_sum"
    _add_to_scores(proto, build)


def _leak_in_loop_body(proto, tensor) -> None:
    def build():
        body = helper.make_graph(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
             helper.make_node("Constant", [], ["leaked"], value=tensor),
             helper.make_node("ReduceSum", ["leaked"], ["v_out"], keepdims=1)],
            "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                     helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                     helper.make_tensor_value_info("v", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])])
        _const(proto, "one_trip", [1], TensorProto.INT64, ())
        _const(proto, "yes", [True], TensorProto.BOOL, ())
        _const(proto, "v0", [0.0])
        return [helper.make_node("Loop", ["one_trip", "yes", "v0"], ["looped"], body=body)], "looped"
    _add_to_scores(proto, build)


# -- what is refused on load --------------------------------------------------------------------------
def _labels(proto) -> list[str]:
    return json.loads({p.key: p.value for p in proto.metadata_props}["labels"])


#: name -> (graph edited, edit, words of the one-line error)
ON_LOAD = {
    # metadata
    "labels empty": ("gmm", lambda p: _meta(p, labels="[]"), "labels"),
    "labels one more": ("gmm", lambda p: _meta(p, labels=json.dumps(_labels(p) + ["extra"])), "shape"),
    "labels one fewer": ("gmm", lambda p: _meta(p, labels=json.dumps(_labels(p)[:-1])), "shape"),
    "labels numbers": ("gmm", lambda p: _meta(p, labels="[1, 2, 3]"), "labels"),
    "labels an object": ("gmm", lambda p: _meta(p, labels='{"a": 1}'), "labels"),
    "labels not JSON": ("gmm", lambda p: _meta(p, labels="[bearing"), "labels is not JSON"),
    "labels repeated": ("gmm", lambda p: _meta(p, labels=json.dumps(["a", "a", "b"])), "repeats"),
    "label with an escape": ("gmm", lambda p: _meta(p, labels=json.dumps(["\x1b[2J\x1b[31mred", "b", "c"])),
                             "control characters"),
    "label with a line break": ("gmm", lambda p: _meta(p, labels=json.dumps(["a\nb", "b", "c"])), "control"),
    "label unknown": ("gmm", lambda p: _meta(p, labels=json.dumps(["unknown", "b", "c"])), "'unknown'"),
    "detector label anomaly": ("normal-dist", lambda p: _meta(p, labels='["anomaly"]'), "'anomaly'"),
    "label_name with an escape": ("gmm", lambda p: _meta(p, label_name="\x1b]0;pwned\x07"), "control"),
    "version with an escape": ("gmm", lambda p: _meta(p, wavetrain_version="\x1b[2J"), "control"),
    "family with an escape": ("gmm", lambda p: _meta(p, family="gmm\x1b[31m"), "control"),
    "score_kind anomaly, no threshold": ("gmm", lambda p: _meta(p, score_kind="anomaly", labels='["x"]'),
                                         "threshold"),
    "detector without threshold": ("normal-dist", lambda p: _meta(p, threshold=None), "threshold"),
    "detector threshold nan": ("normal-dist", lambda p: _meta(p, threshold="nan"), "threshold"),
    "detector with three labels": ("normal-dist", lambda p: _meta(p, labels='["a", "b", "c"]'), "one value"),
    "score_kind unknown": ("gmm", lambda p: _meta(p, score_kind="magic"), "score_kind"),
    "rate a word": ("gmm", lambda p: _meta(p, rate="fast"), "rate"),
    "rate zero": ("gmm", lambda p: _meta(p, rate="0"), "rate"),
    "rate huge": ("gmm", lambda p: _meta(p, rate="100000000000"), "rate"),
    "min_samples zero": ("gmm", lambda p: _meta(p, min_samples="0"), "min_samples"),
    "min_samples other": ("gmm", lambda p: _meta(p, min_samples="401"), "min_samples"),
    "clip_ms negative": ("gmm", lambda p: _meta(p, clip_ms="-5"), "clip_ms"),
    "pad unknown": ("gmm", lambda p: _meta(p, pad="mirror"), "pad"),
    "features broken": ("gmm", lambda p: _meta(p, features="logmel(bands="), "features"),
    "outputs not JSON": ("gmm", lambda p: _meta(p, outputs="z"), "outputs"),
    "outputs names scores": ("gmm", lambda p: _meta(p, outputs='["z", "scores"]'), "outputs"),
    "outputs lists a missing one": ("gmm", lambda p: _meta(p, outputs='["z", "warp"]'), "outputs"),
    "unknown rule of no kind": ("knn", lambda p: _meta(p, unknown='{"rule": "magic"}'), "unknown"),
    "unknown rule on no output": ("knn", lambda p: _meta(p, unknown='{"rule": "above", "output": "z", "value": 1}'),
                                  "none of the graph's outputs"),
    "unknown rule without a value": ("knn", lambda p: _meta(p, unknown='{"rule": "above", "output": "nearest"}'),
                                     "finite"),
    "unknown floors short": ("gmm", lambda p: _meta(p, unknown='{"rule": "best_below", "floors": [1.0]}'), "floors"),
    "metadata missing": ("gmm", lambda p: _meta(p, family=None), "without wavetrain's metadata"),
    # the graph's inputs and outputs
    "input renamed": ("gmm", lambda p: _rename_input(p, "x"), "inputs are 'x'"),
    "input float64": ("gmm", lambda p: p.graph.input[0].type.tensor_type.__setattr__("elem_type", TensorProto.DOUBLE),
                      "float32"),
    "input 2-D": ("gmm", lambda p: p.graph.input[0].type.tensor_type.shape.dim.add(dim_value=1), "(n,)"),
    "input a second": ("gmm", lambda p: p.graph.input.append(helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                           ["n"])), "inputs"),
    "output best missing": ("gmm", lambda p: p.graph.output.remove(next(o for o in p.graph.output if o.name == "best")),
                            "outputs are"),
    "output scores missing": ("gmm", lambda p: p.graph.output.remove(p.graph.output[0]), "outputs are"),
    "detail output missing": ("gmm", lambda p: p.graph.output.remove(next(o for o in p.graph.output if o.name == "z")),
                              "outputs are"),
    "output best float": ("gmm", lambda p: next(o for o in p.graph.output if o.name == "best").type.tensor_type
                          .__setattr__("elem_type", TensorProto.FLOAT), "int64"),
    # the probe
    "best out of range": ("gmm", lambda p: _wrap(p, "best", lambda raw: [
        helper.make_node("Add", [raw, _const(p, "c99", [99], TensorProto.INT64)], ["best"])]), "outside the 3 label"),
    "best negative": ("gmm", lambda p: _wrap(p, "best", lambda raw: [
        helper.make_node("Sub", [raw, _const(p, "c9", [9], TensorProto.INT64)], ["best"])]), "outside"),
    "scores NaN": ("gmm", lambda p: _wrap(p, "scores", lambda raw: [
        helper.make_node("Mul", [raw, _const(p, "nan1", [math.nan])], ["scores"])]), "NaN"),
    "scores infinite": ("normal-dist", lambda p: _wrap(p, "scores", lambda raw: [
        helper.make_node("Add", [raw, _const(p, "inf1", [math.inf])], ["scores"])]), "infinite"),
    "scores wider": ("gmm", lambda p: _wrap(p, "scores", lambda raw: [
        helper.make_node("Concat", [raw, raw], ["scores"], axis=0)]), "shape"),
    "detail infinite": ("gmm", lambda p: _wrap(p, "z", lambda raw: [
        helper.make_node("Add", [raw, _const(p, "inf1", [math.inf])], ["z"])]), "infinite z"),
    "4 TB ConstantOfShape": ("gmm", lambda p: _constant_of_shape(p, 10**12), "memory"),
}


@pytest.mark.parametrize("case", sorted(ON_LOAD))
def test_hostile_graph_is_refused_on_load(graphs, tmp_path, case):
    name, edit, words = ON_LOAD[case]
    proto = _proto(graphs[name])
    edit(proto)
    path = _save(proto, tmp_path / "hostile.onnx")
    with pytest.raises(ModelFileError) as e:
        load_model(path)
    text = str(e.value)
    assert words in text and "\n" not in text and "\x1b" not in text, text
    assert text.startswith(str(path))


def test_every_command_refuses_a_hostile_graph_in_one_line(graphs, demo_csv, tmp_path, capsys):
    proto = _proto(graphs["gmm"])
    _meta(proto, labels=json.dumps(["\x1b[2J\x1b[31mred", "b", "c"]))
    path = _save(proto, tmp_path / "ansi.onnx")
    wav = sorted(Path(demo_csv).parent.glob("*.wav"))[0]
    for argv in (["info", str(path)], ["classify", "-m", str(path), str(wav)],
                 ["evaluate", "-m", str(path), "--data", str(demo_csv), "--label", "state"]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert "\x1b" not in out + err and len(err.strip().splitlines()) == 1 and "control characters" in err, argv


def test_the_exported_graphs_load(graphs):
    """The contract holds for what the exporter writes (the rest of the export's tests load every
    family's graph)."""
    for name, path in graphs.items():
        model = load_model(path)
        assert model.fitted_labels and model.run_timeout_s > 0, name


# -- data in other files ------------------------------------------------------------------------------
@pytest.fixture()
def secret(tmp_path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    path = folder / "secret.bin"
    path.write_bytes(np.array([1.5, 2.5, 3.5, 4.5], np.float32).tobytes())
    return path


@pytest.mark.parametrize("where", ["absolute", "parent", "in the folder", "hard link"])
@pytest.mark.parametrize("how", ["initializer", "constant", "sparse", "loop body"])
def test_data_in_another_file_is_never_read(graphs, tmp_path, secret, where, how):
    """Wherever the tensor is, and wherever its file is (a hard link in the graph's own folder
    included, which onnxruntime's own check lets through), the graph is refused before onnxruntime
    opens it."""
    folder = tmp_path / "model"
    folder.mkdir()
    if where == "hard link":
        os.link(secret, folder / "weights.bin")
        location = "weights.bin"
    elif where == "in the folder":
        (folder / "weights.bin").write_bytes(secret.read_bytes())
        location = "weights.bin"
    else:
        location = str(secret) if where == "absolute" else "../outside/secret.bin"
    proto = _proto(graphs["gmm"])
    edit = {"initializer": _leak, "constant": _leak_in_constant, "sparse": _leak_sparse,
            "loop body": _leak_in_loop_body}[how]
    edit(proto, _external("leak", location))
    path = _save(proto, folder / "hostile.onnx")
    with pytest.raises(ModelFileError, match="keeps its data in another file"):
        load_model(path)


# -- bounded runs ---------------------------------------------------------------------------------------
def test_a_graph_that_never_ends_is_stopped_on_load(graphs, tmp_path, monkeypatch):
    proto = _proto(graphs["gmm"])
    _add_to_scores(proto, lambda: _loop(proto, ""))
    path = _save(proto, tmp_path / "forever.onnx")
    monkeypatch.setenv("WAVETRAIN_GRAPH_TIMEOUT", "1")
    with pytest.raises(ModelFileError, match=r"took more than 1\.1 s and was stopped"):
        load_model(path)
    threads = threading.active_count()
    with pytest.raises(ModelFileError, match=r"took more than 1\.1 s and was stopped"):
        load_model(path)
    assert threading.active_count() == threads          # the stopped run's thread served the next


def _loud_clip(seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.6 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_a_run_past_its_deadline_raises_and_leaves_the_model_usable(graphs, tmp_path):
    """The hang happens only on loud clips (the probe's are quiet): the run raises at its deadline
    (1 s, plus 0.1 s per second of audio), the caller gets its thread back, and the same model
    scores the next clip."""
    proto = _proto(graphs["gmm"])
    _hang_when_loud(proto)
    model = load_model(_save(proto, tmp_path / "hang.onnx"))
    good = load_model(graphs["gmm"])
    quiet = 0.1 * _loud_clip()
    model.run_timeout_s = 1.0
    with pytest.raises(GraphRunError, match=r"took more than 1\.1 s"):
        model.score_clips([_loud_clip()])
    threads = threading.active_count()
    with pytest.raises(GraphRunError, match=r"took more than 1\.1 s"):
        model.score_clips([_loud_clip()])
    assert threading.active_count() == threads          # the stopped run's thread served the next
    names, scores, _ = model.score_clips([quiet])
    assert names == good.score_clips([quiet])[0]
    np.testing.assert_allclose(scores, good.score_clips([quiet])[1], rtol=1e-6)


def test_nan_scores_are_never_an_answer(graphs, tmp_path, loud_wav, capsys):
    proto = _proto(graphs["gmm"])
    _nan_when_loud(proto)
    path = _save(proto, tmp_path / "nan.onnx")
    model = load_model(path)                         # the probe's clips are quiet
    with pytest.raises(GraphRunError, match="NaN or infinite score"):
        model.score_clips([_loud_clip()])
    capsys.readouterr()
    assert main(["classify", "-m", str(path), str(loud_wav)]) == 2
    out, err = capsys.readouterr()
    assert "nan" not in out.lower() and len(err.strip().splitlines()) == 1 and "NaN or infinite" in err


def _child(argv: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, str, float]:
    """``wavetrain argv`` in a fresh process: exit code, stderr and its peak RSS (MB: ``VmHWM``, the
    high-water mark of its own memory; ``getrusage``'s would include the test process it was
    forked from)."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs /proc to measure a process's peak memory")
    code = ("import sys\nfrom wavetrain.cli.main import main\n"
            "try:\n    rc = main(sys.argv[1:])\nfinally:\n"
            "    hwm = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')][0]\n"
            "    sys.stderr.write(f'\\nRSS_MB {int(hwm) / 1024:.0f}\\n')\n"
            "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    err, rss = r.stderr.rsplit("RSS_MB", 1)
    return r.returncode, err.strip(), float(rss)


def _constant_of_static_shape(proto, n: int) -> None:
    """A tensor of ``n`` zeros whose shape is computed from the shape of a tensor of static shape
    (onnxruntime folds ``Shape`` of one as a constant)."""
    def build():
        _const(proto, "times", [n], TensorProto.INT64)
        value = helper.make_tensor("fill", TensorProto.FLOAT, [1], [1.0])
        return [helper.make_node("ReduceSum", ["audio"], ["one"], keepdims=1),
                helper.make_node("Shape", ["one"], ["one_shape"]),
                helper.make_node("Mul", ["one_shape", "times"], ["big_shape"]),
                helper.make_node("ConstantOfShape", ["big_shape"], ["big"], value=value),
                helper.make_node("ReduceSum", ["big"], ["big_sum"], keepdims=1)], "big_sum"
    _add_to_scores(proto, build)


@pytest.mark.parametrize("how", ["one node", "three constant nodes", "the shape of a static shape"])
def test_a_graph_run_is_bounded_in_memory(graphs, tmp_path, how):
    """Tensors of 1.2 GB asked for by one node (or by constant nodes, which onnxruntime would
    compute as the session is created): refused in one line under a bound of 256 MB, the process
    never near their size."""
    proto = _proto(graphs["gmm"])
    if how == "the shape of a static shape":
        _constant_of_static_shape(proto, 300_000_000)
    else:
        _constant_of_shape(proto, 300_000_000, 1 if how == "one node" else 3)
    path = _save(proto, tmp_path / "big.onnx")
    rc, err, rss = _child(["info", str(path)], {"WAVETRAIN_GRAPH_MEMORY": "256M"})
    assert rc == 2 and len(err.splitlines()) == 1 and "more memory than the 0.25 GiB" in err, err
    assert rss < 700, rss


def test_ctrl_c_stops_a_graph_run(graphs, tmp_path, loud_wav):
    """``classify -m`` on a graph that hangs on loud clips: a SIGINT ends it with exit code 130
    (the run is told to stop; the command does not wait for the deadline)."""
    proto = _proto(graphs["gmm"])
    _hang_when_loud(proto)
    path = _save(proto, tmp_path / "hang.onnx")
    p = subprocess.Popen([sys.executable, "-m", "wavetrain.cli.main", "classify", "-m", str(path), str(loud_wav)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "WAVETRAIN_GRAPH_TIMEOUT": "3600"},
                         # (a suite started in the background inherits SIGINT ignored: give the child Ctrl-C)
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        import psutil

        proc = psutil.Process(p.pid)
        start = time.monotonic()                # (the graph spins: wait until the process has run
        while proc.cpu_times().user < 4 and p.poll() is None and time.monotonic() - start < 120:  # a while)
            time.sleep(0.2)
        assert p.poll() is None, p.communicate()
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert rc == 130, p.communicate()


def test_bounds_from_the_environment_are_checked(monkeypatch):
    from wavetrain.core.errors import ParameterError
    from wavetrain.models.onnx_model import graph_memory_bytes, graph_timeout_s

    monkeypatch.setenv("WAVETRAIN_GRAPH_TIMEOUT", "2.5")
    monkeypatch.setenv("WAVETRAIN_GRAPH_MEMORY", "3G")
    assert graph_timeout_s() == 2.5 and graph_memory_bytes() == 3 << 30
    for var, bad in (("WAVETRAIN_GRAPH_TIMEOUT", "-1"), ("WAVETRAIN_GRAPH_TIMEOUT", "soon"),
                     ("WAVETRAIN_GRAPH_MEMORY", "12"), ("WAVETRAIN_GRAPH_MEMORY", "lots")):
        monkeypatch.setenv(var, bad)
        with pytest.raises(ParameterError, match=var):
            graph_timeout_s() if "TIMEOUT" in var else graph_memory_bytes()


def test_a_plain_graph_runs_under_a_small_memory_bound(graphs):
    """(the bound of the memory test refuses what is hostile, not an exported graph)"""
    rc, err, rss = _child(["info", str(graphs["gmm"])], {"WAVETRAIN_GRAPH_MEMORY": "256M"})
    assert rc == 0 and rss < 700, err
