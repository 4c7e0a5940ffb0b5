"""Damaged and hostile model files: one tiny fitted model of every family, mutated many ways.

Every mutation must end in one of two ways: :func:`load_model` refuses the file with a one-line
:class:`ModelFileError`, or the model it loads gives finite scores, one column per stored label
value (one for a detector), on test windows. Nothing else (no other exception, no inf or NaN)."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from wavetrain.cli.main import main
from wavetrain.core.errors import ModelFileError, UserError
from wavetrain.features import extract
from wavetrain.models import build, family, family_names, load_model, save_model
from wavetrain.train.array_stream import ArrayStream

RATE = 16000

#: Tiny configurations (fast to train; several of each kind of state).
TINY = {
    "gmm": {"components": 2, "features": "logmel(bands=8)"},
    "cnn": {"epochs": 1, "batch_size": 8, "features": "logmel(bands=16)", "valid_fraction": 0},
    "dcase": {"epochs": 1, "batch_size": 8, "features": "logmel(bands=16)", "valid_fraction": 0},
    "rescnn": {"epochs": 1, "batch_size": 8, "width": 4, "features": "logmel(bands=16)", "valid_fraction": 0},
    "normal-dist": {"features": "logmel(bands=8)"},
    "anomaly-gmm": {"components": 2, "features": "logmel(bands=8)"},
    "knn": {"capacity": 20, "k": 3, "features": "logmel(bands=8)", "unknown_distance": 100.0},
    "knn-anomaly": {"capacity": 20, "k": 3, "subwindow_frames": 4, "features": "logmel(bands=8)"},
    "autoencoder": {"epochs": 1, "batch_size": 32, "hidden": 8, "layers": 1, "features": "logmel(bands=8)"},
    "ensemble": {"members": '[{"model": "gmm", "components": 2, "features": "logmel(bands=4)"}, '
                            '{"model": "knn", "capacity": 10, "features": "mfcc(bands=12, coeffs=6)"}]',
                 "combine": "weighted", "weights": "1,2"},
}


def _tone(freq: float, seed: int, seconds: float = 0.4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.4 * np.sin(2 * np.pi * freq * t) + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


def _fit(name: str):
    declared = {p.name for p in family(name).param_table()}
    model = build(name, {k: v for k, v in TINY.get(name, {}).items() if k in declared})
    spec = model.feature_spec
    freqs = (440.0, 1800.0)
    grams = [extract(_tone(freqs[i % 2], i), RATE, spec) for i in range(16)]
    y = [i % 2 for i in range(16)]
    if model.detector:
        normal = [g for g, c in zip(grams, y) if c == 0]
        model.fit(ArrayStream(normal, [0] * len(normal), ["hum"], batch_size=8))
    else:
        model.fit(ArrayStream(grams, y, ["low", "high"], batch_size=8))
    model.feature_rate_ = RATE      # as a model trained on recordings records it
    return model, grams


#: Families whose many network arrays make the mutation run long (cnn covers their shared code).
SLOW = ("dcase", "rescnn")


@pytest.fixture(scope="module", params=[pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                        for n in family_names()])
def saved(request, tmp_path_factory):
    model, grams = _fit(request.param)
    path = save_model(model, tmp_path_factory.mktemp(request.param.replace("-", "_")) / "model.wt")
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(z["__meta__"].tobytes().decode())
        weights = {k[2:]: z[k] for k in z.files if k.startswith("w/")}
    test_windows = [grams[0], grams[1], np.random.default_rng(1).normal(0, 3, grams[0].shape).astype(np.float32)]
    return request.param, path, meta, weights, test_windows


def _write(path, meta: dict, weights: dict[str, np.ndarray]) -> None:
    arrays = {"__meta__": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}
    arrays.update({"w/" + k: v for k, v in weights.items()})
    with open(path, "wb") as f:
        np.savez(f, **arrays)


Mutation = tuple[str, Callable[[dict, dict], None]]


def _array_mutations(key: str, v: np.ndarray) -> Iterator[Mutation]:
    def put(fn):
        def apply(meta, w):
            w[key] = fn(w[key])
        return apply

    def fill(value):
        def fn(a):
            b = np.array(a, dtype=np.float64).reshape(-1)
            if b.size:
                b[b.size // 2] = value
            return b.reshape(a.shape)
        return fn

    yield f"{key}: removed", lambda meta, w: w.pop(key)
    yield f"{key}: truncated", put(lambda a: a[:-1] if a.ndim else a.reshape(1)[:0])
    yield f"{key}: one row more", put(lambda a: np.concatenate([a, a[-1:]]) if a.ndim else np.stack([a, a]))
    yield f"{key}: flattened", put(lambda a: a.reshape(-1))
    yield f"{key}: shape swapped", put(lambda a: a.reshape(a.shape[::-1]) if a.ndim > 1 else a[None])
    yield f"{key}: integers", put(lambda a: np.round(a).astype(np.int64))
    yield f"{key}: float64", put(lambda a: a.astype(np.float64))
    yield f"{key}: float32", put(lambda a: a.astype(np.float32))
    yield f"{key}: strings", put(lambda a: a.astype(str))
    yield f"{key}: nan", put(fill(np.nan))
    yield f"{key}: inf", put(fill(np.inf))
    yield f"{key}: 1e300", put(fill(1e300))
    yield f"{key}: -1e300", put(fill(-1e300))
    yield f"{key}: 1e-300", put(fill(1e-300))
    yield f"{key}: zeros", put(np.zeros_like)
    yield f"{key}: negative", put(lambda a: -np.abs(a) - 1 if a.dtype.kind in "fi" else a)
    yield f"{key}: 1e20", put(lambda a: np.full(a.shape, 1e20))


def _meta_mutations(meta: dict, table) -> Iterator[Mutation]:
    labels = meta["labels"]

    def set_meta(key, value):
        def apply(m, w):
            m[key] = value
        return apply

    def set_param(key, value):
        def apply(m, w):
            m["params"][key] = value
        return apply

    yield "labels: last dropped", set_meta("labels", labels[:-1])
    yield "labels: one appended", set_meta("labels", labels + ["extra"])
    yield "labels: fifty", set_meta("labels", [f"v{i}" for i in range(50)])
    yield "labels: repeated", set_meta("labels", labels + labels[:1])
    yield "labels: a number", set_meta("labels", [1, 2])
    yield "labels: anomaly", set_meta("labels", ["anomaly"] + labels[1:])
    yield "labels: a line break", set_meta("labels", ["a\nb"] + labels[1:])
    yield "labels: a terminal escape", set_meta("labels", ["\x1b[2J\x1b[31mred"] + labels[1:])
    yield "labels: a C1 escape", set_meta("labels", ["\x9b2J"] + labels[1:])
    yield "labels: unknown", set_meta("labels", ["unknown"] + labels[1:])
    yield "created: a terminal escape", set_meta("created", "\x1b]0;pwned\x07")
    yield "versions: a terminal escape", set_meta("versions", {"wavetrain": "\x1b[2J"})
    yield "history: a terminal escape", set_meta("history", [{"note": "\x1b[2J"}])
    yield "label_name: a list", set_meta("label_name", ["x"])
    yield "feature_dim: +1", set_meta("feature_dim", meta["feature_dim"] + 1)
    yield "feature_dim: huge", set_meta("feature_dim", 10**12)
    yield "feature_rate: 8000", set_meta("feature_rate", 8000)
    yield "feature_rate: huge", set_meta("feature_rate", 10**15)
    yield "versions: a list", set_meta("versions", ["x"])
    yield "training: a string", set_meta("training", "x")
    yield "history: numbers", set_meta("history", [1, 2])
    for key in ("model", "params", "labels", "feature_dim", "format", "format_version"):
        yield f"{key}: removed", lambda m, w, key=key: m.pop(key)
    yield "model: another family", set_meta("model", "gmm" if meta["model"] != "gmm" else "knn")
    yield "params: unknown", set_param("nosuch", 1)
    yield "params: clip_ms=1e15", set_param("clip_ms", 1e15)
    yield "params: clip_ms=1e8", set_param("clip_ms", 10**8)
    yield "params: features", set_param("features", "logmel(bands=9)")
    yield "params: bad features", set_param("features", "logmel(bands=")
    for p in table:
        if p.type in (int, float):
            if p.high is not None:
                yield f"params: {p.name} above", set_param(p.name, p.high * 10 + 1)
            if p.low is not None:
                yield f"params: {p.name} below", set_param(p.name, p.low - 1)
            yield f"params: {p.name} nan", set_param(p.name, float("nan"))
            yield f"params: {p.name} string", set_param(p.name, "x")


def _mutations(meta: dict, weights: dict) -> Iterator[Mutation]:
    yield from _meta_mutations(meta, family(meta["model"]).param_table())
    net = [k for k in weights if k.startswith("net.")]
    keep = set(net[:2] + net[len(net) // 2:len(net) // 2 + 1] + net[-2:])   # a network's first, middle, last
    for key, v in weights.items():
        if key in keep or not key.startswith("net."):
            yield from _array_mutations(key, v)
    yield "weights: an extra array", lambda m, w: w.update(extra=np.ones(3))
    yield "weights: all times 1e20", lambda m, w: w.update({k: v * 1e20 for k, v in w.items() if v.dtype.kind == "f"})


def _outcome(path, labels_width: int, windows) -> str | None:
    """None when the file is refused in one line or loads into a model with finite scores of
    the right width and no infinite detail; else what went wrong."""
    try:
        model = load_model(path)
    except ModelFileError as e:
        text = str(e)
        if "\n" in text or "allow_pickle" in text:
            return f"refused with a bad message: {text!r}"
        return None
    except Exception as e:  # noqa: BLE001 (any other error is what this test looks for)
        return f"{type(e).__name__}: {e}"
    try:
        names, scores, details = model.predict_scores(windows)
    except Exception as e:  # noqa: BLE001
        return f"loaded, then predict_scores raised {type(e).__name__}: {e}"
    width = 1 if model.detector else len(model.fitted_labels)
    if width != labels_width:
        return f"loaded with {width} label values, the file lists {labels_width}"
    if np.shape(scores) != (len(windows), width) or not np.isfinite(scores).all():
        return f"loaded, scores of shape {np.shape(scores)} finite={np.isfinite(scores).all()}"
    for k, v in details.items():       # (NaN: undefined, e.g. a gmm's z for a value whose windows scored alike)
        if np.asarray(v).dtype.kind == "f" and np.isinf(v).any():
            return f"loaded, detail {k} infinite"
    return None


def test_the_unchanged_file_loads_and_scores(saved, capsys):
    name, path, meta, weights, windows = saved
    model = load_model(path)
    _, scores, _ = model.predict_scores(windows)
    assert np.isfinite(scores).all()
    assert main(["info", str(path)]) == 0            # info accepts what load_model accepts
    assert f"model      {name}" in capsys.readouterr().out


def test_every_mutation_is_refused_or_harmless(saved, tmp_path):
    name, path, meta, weights, windows = saved
    failures, refused = [], 0
    for what, mutate in _mutations(meta, weights):
        m, w = json.loads(json.dumps(meta)), {k: v.copy() for k, v in weights.items()}
        try:
            mutate(m, w)
        except (ValueError, TypeError, IndexError):
            continue                    # the mutation does not apply to this array
        target = tmp_path / "mutated.wt"
        _write(target, m, w)
        width = len(m["labels"]) if isinstance(m.get("labels"), list) else -1
        problem = _outcome(target, 1 if family(meta["model"]).detector else width, windows)
        if problem:
            failures.append(f"{name}, {what}: {problem}")
        else:
            refused += 1
    assert not failures, "\n".join(failures[:30])
    assert refused > 40


@pytest.mark.parametrize("what", ["labels: one appended", "labels: a line break", "params: clip_ms=1e15",
                                  "feature_dim: +1", "labels: a terminal escape", "labels: a C1 escape",
                                  "created: a terminal escape", "versions: a terminal escape",
                                  "history: a terminal escape", "weights: an extra array",
                                  "weights: all times 1e20"])
def test_named_damage_is_refused(saved, tmp_path, what):
    """The damage the issue reports is refused (not merely harmless) for every family."""
    name, path, meta, weights, windows = saved
    mutate = dict(_mutations(meta, weights))[what]
    m, w = json.loads(json.dumps(meta)), dict(weights)
    mutate(m, w)
    _write(tmp_path / "m.wt", m, w)
    with pytest.raises(ModelFileError):
        load_model(tmp_path / "m.wt")


def test_float_state_stored_as_integers_is_refused(saved, tmp_path):
    name, path, meta, weights, windows = saved
    key = next(k for k, v in weights.items() if v.dtype.kind == "f" and v.size > 1)
    w = dict(weights)
    w[key] = np.round(w[key]).astype(np.int64)
    _write(tmp_path / "m.wt", meta, w)
    with pytest.raises(ModelFileError, match="floating-point|type int64"):
        load_model(tmp_path / "m.wt")


def test_huge_values_are_refused(saved, tmp_path):
    name, path, meta, weights, windows = saved
    key = next(k for k, v in weights.items() if v.dtype.kind == "f")
    w = dict(weights)
    w[key] = np.full(w[key].shape, 1e300)
    _write(tmp_path / "m.wt", meta, w)
    with pytest.raises(ModelFileError, match="large"):
        load_model(tmp_path / "m.wt")


def _zip(path, members: dict[str, bytes], compression=0) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, data in members.items():
            z.writestr(name, data)


def _npy_bytes(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_forged_array_header_is_refused_before_allocating(tmp_path):
    """A header promising 80 GB in a 64-byte member is one line (not numpy's out-of-memory)."""
    import io

    from numpy.lib import format as npy

    head = io.BytesIO()
    npy.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False, "shape": (10**10,)})
    meta = _npy_bytes(np.frombuffer(json.dumps({"format": "wavetrain-model"}).encode(), np.uint8))
    _zip(tmp_path / "m.wt", {"__meta__.npy": meta, "w/x.npy": head.getvalue() + bytes(64)})
    with pytest.raises(ModelFileError, match="does not hold"):
        load_model(tmp_path / "m.wt")


def test_zip_bomb_is_refused(tmp_path):
    import zipfile

    _zip(tmp_path / "m.wt", {"w/x.npy": _npy_bytes(np.zeros(4_000_000))}, compression=zipfile.ZIP_DEFLATED)
    with pytest.raises(ModelFileError, match="unpack"):
        load_model(tmp_path / "m.wt")


@pytest.mark.parametrize("content,words", [
    (b"\x80\x04\x95" + bytes(20), "Python pickle"), (b"", "empty"), (b"\x93NUMPY" + bytes(20), "numpy array"),
    (b"hello world", "not a zip"),
])
def test_non_zip_files_are_named(tmp_path, content, words):
    (tmp_path / "m.wt").write_bytes(content)
    with pytest.raises(ModelFileError, match=words) as e:
        load_model(tmp_path / "m.wt")
    assert "allow_pickle" not in str(e.value) and "\n" not in str(e.value)


def test_object_array_member_never_suggests_pickle(tmp_path):
    with open(tmp_path / "m.wt", "wb") as f:
        np.savez(f, __meta__=np.array([{"format": "wavetrain-model"}], dtype=object))
    with pytest.raises(ModelFileError, match="Python objects") as e:
        load_model(tmp_path / "m.wt")
    assert "allow_pickle" not in str(e.value)


def test_the_value_unknown_is_refused_for_classifiers_only(saved, tmp_path):
    """``unknown`` is what a classifier answers for a window of none of its values: never one of
    them; a detector answers its normal value or ``anomaly``, and its normal value may be any."""
    name, path, meta, weights, windows = saved
    m = json.loads(json.dumps(meta))
    m["labels"] = ["unknown"] + m["labels"][1:]
    _write(tmp_path / "m.wt", m, weights)
    if family(name).detector:
        assert load_model(tmp_path / "m.wt").fitted_labels == ["unknown"]
    else:
        with pytest.raises(ModelFileError, match="'unknown'"):
            load_model(tmp_path / "m.wt")


def test_a_classifier_is_never_trained_on_the_value_unknown():
    grams = [np.random.default_rng(i).normal(size=(20, 4)).astype(np.float32) for i in range(8)]
    model = build("gmm", {"components": 1, "features": "logmel(bands=4)"})
    with pytest.raises(UserError, match="cannot be 'unknown'"):
        model.fit(ArrayStream(grams, [i % 2 for i in range(8)], ["dog", "unknown"], batch_size=4))


def test_a_detector_threshold_fits_its_normal_scores(saved, tmp_path):
    """A detector stores (threshold, mean and sd of the normal scores): an sd below 0 is refused,
    and an sd of 0 (every normal window scored alike) only with the threshold at their mean."""
    name, path, meta, weights, windows = saved
    if not family(name).detector:
        pytest.skip("a detector's state")
    t, mean, sd = (float(v) for v in weights["threshold"])
    for stored, ok in (([t, mean, -abs(sd) - 1.0], False), ([t + 1.0, t, 0.0], False), ([t, t, 0.0], True)):
        w = dict(weights)
        w["threshold"] = np.array(stored)
        _write(tmp_path / "m.wt", meta, w)
        if ok:
            load_model(tmp_path / "m.wt")
        else:
            with pytest.raises(ModelFileError, match="sd"):
                load_model(tmp_path / "m.wt")


def test_many_members_of_zeros_are_refused_before_any_is_read(saved, tmp_path):
    """800 extra members of 1 MB of zeros each, deflated to about a kilobyte: the total they would
    unpack to is refused before one array is read (each member alone passes the per-member ratio)."""
    import zipfile

    name, path, meta, weights, windows = saved
    bomb = tmp_path / "bomb.wt"
    zeros = _npy_bytes(np.zeros(1 << 17))
    with zipfile.ZipFile(path) as z, zipfile.ZipFile(bomb, "w") as out:
        for info in z.infolist():
            out.writestr(info, z.read(info))
        for i in range(800):
            out.writestr(f"w/extra{i}.npy", zeros, compress_type=zipfile.ZIP_DEFLATED)
    assert bomb.stat().st_size - path.stat().st_size < 1 << 20      # 800 MB of zeros in under 1 MB
    with pytest.raises(ModelFileError, match="members would unpack to"):
        load_model(bomb)


def test_bytes_beyond_an_array_are_refused(tmp_path):
    meta = _npy_bytes(np.frombuffer(json.dumps({"format": "wavetrain-model"}).encode(), np.uint8))
    _zip(tmp_path / "m.wt", {"__meta__.npy": meta, "w/x.npy": _npy_bytes(np.ones(2)) + bytes(1 << 16)})
    with pytest.raises(ModelFileError, match="65,536 bytes beyond its array"):
        load_model(tmp_path / "m.wt")
