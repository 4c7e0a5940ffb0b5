"""Bad input never produces a traceback: every case below exits with code 2 and prints exactly one
line on stderr, ``wavetrain: error: ...``, that names the file (and line) or parameter at fault,
and leaves nothing behind (no model file, no temporary file, nothing new beside the inputs).

Cases are grouped by what is wrong: audio files, metadata, parameters, model files and output
paths. Each is run in-process through ``wavetrain.cli.main.main``.
"""
from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import main

RATE = 16000
STATES = ("healthy", "bearing", "loose")


# ---- fixtures: a small good data set and a trained model ------------------------------------------
def _tone(freq: float, seconds: float = 0.5, rate: int = RATE, channels: int = 1) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    x = 0.3 * np.sin(2 * np.pi * freq * t) + 0.01 * np.random.default_rng(int(freq)).normal(size=t.size)
    x = x.astype(np.float32)
    return x if channels == 1 else np.stack([x] * channels, axis=1)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """``good/``: 12 wav files (4 per state, speakers m0/m1) with a metadata.csv; ``model.wt``: a
    gmm trained on them; ``neural.wt``: a tiny cnn; ``axis.wt``: a per-axis gmm on 2 channels."""
    root = tmp_path_factory.mktemp("bad-inputs")
    good = root / "good"
    good.mkdir()
    rows = []
    for s, state in enumerate(STATES):
        for i in range(4):
            name = f"{state}{i}.wav"
            sf.write(good / name, _tone(200 + 300 * s + 7 * i), RATE)
            rows.append(f"{name},state={state};machine=m{i % 2}\n")
    (good / "metadata.csv").write_text("".join(rows))
    os.environ["WAVETRAIN_CACHE"] = str(root / "cache")
    os.environ["WAVETRAIN_PROGRESS"] = "0"
    common = ["--data", str(good), "--label", "state", "--cache", str(root / "cache")]
    assert main(["train", *common, "--model", "gmm", "--set", "components=2", "-o", str(root / "model.wt")]) == 0
    axis = root / "axis"
    axis.mkdir()
    for s, state in enumerate(STATES):
        for i in range(2):
            sf.write(axis / f"{state}{i}.wav", _tone(300 + 400 * s + 9 * i, channels=2), RATE)
    (axis / "metadata.csv").write_text("".join(f"{state}{i}.wav,state={state}\n" for state in STATES
                                               for i in range(2)))
    assert main(["train", "--data", str(axis), "--label", "state", "--model", "gmm", "--set", "components=2",
                 "--features", "logmel(bands=16, per_axis=true)", "-o", str(root / "axis.wt"),
                 "--cache", str(root / "cache")]) == 0
    return root


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size if p.is_file() else -1)
            for p in folder.rglob("*") if "cache" not in p.relative_to(folder).parts}


def _check(capsys, case: Path, argv: list[str], expect: str | tuple[str, ...]) -> str:
    """Run ``argv`` and assert the bad-input contract; returns the error line."""
    capsys.readouterr()
    before = _snapshot(case)
    code = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, f"exit code {code}, stderr: {err!r}"
    assert "Traceback" not in err and len(lines) == 1, f"expected one line, got: {err!r}"
    assert lines[0].startswith("wavetrain: error: "), lines[0]
    for e in (expect,) if isinstance(expect, str) else expect:
        assert e in lines[0], f"{e!r} not in {lines[0]!r}"
    if os.environ.get("WT_SHOW_ERRORS"):
        with open(os.environ["WT_SHOW_ERRORS"], "a") as f:
            f.write(" ".join(argv[:1]) + " | " + lines[0] + "\n")
    assert _snapshot(case) == before, "files were left behind or changed"
    cache_tmp = case.parents[1] / "cache" / "tmp"
    assert not (cache_tmp.exists() and list(cache_tmp.iterdir())), "temporary store files left behind"
    return lines[0]


# ---- audio ---------------------------------------------------------------------------------------
def _write_wav_header_only(p: Path) -> None:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(0, np.float32), RATE, format="WAV")
    p.write_bytes(buf.getvalue())


def _truncated(p: Path) -> None:
    sf.write(p, _tone(440), RATE)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3])


def _float(value: float):
    def make(p: Path) -> None:
        x = _tone(440)
        x[100:200] = value
        sf.write(p, x, RATE, subtype="FLOAT")
    return make


def _zip_bytes(p: Path) -> None:
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("x.txt", "not audio")


BAD_AUDIO = {
    "empty": lambda p: p.write_bytes(b""),
    "text": lambda p: p.write_text("this is not audio\n" * 20),
    "random-bytes": lambda p: p.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, np.uint8).tobytes()),
    "riff-garbage": lambda p: p.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\xff" * 40),
    "header-only": _write_wav_header_only,
    "truncated": _truncated,
    "nan": _float(np.nan),
    "inf": _float(np.inf),
    "huge": lambda p: sf.write(p, np.full(8000, 1e30, np.float32), RATE, subtype="FLOAT"),
    "too-short": lambda p: sf.write(p, _tone(440)[:40], RATE),
    "one-hz": lambda p: sf.write(p, np.zeros(30, np.float32), 1),
    "a-folder": lambda p: p.mkdir(),
    "zip": _zip_bytes,
    "dangling-link": lambda p: p.symlink_to(p.parent / "nowhere.wav"),
    "missing": lambda p: None,
}


#: Faults found only when the samples are decoded (the header is fine).
DECODED_ONLY = ("nan", "inf", "huge", "too-short", "one-hz")


def _bad_set(case: Path, kind: str) -> tuple[Path, Path]:
    """A copy of the good set's metadata (files referenced by absolute path) plus one bad file."""
    data = case / "data"
    data.mkdir()
    bad = data / f"bad-{kind}.wav"
    BAD_AUDIO[kind](bad)
    good = case.parent.parent / "good"
    rows = [f"{good / line.split(',')[0]},{line.split(',', 1)[1]}"
            for line in (good / "metadata.csv").read_text().splitlines()]
    rows.append(f"{bad.name},state=healthy;machine=m0")
    (data / "metadata.csv").write_text("\n".join(rows) + "\n")
    return data, bad


_CASES = itertools.count()


@pytest.fixture
def case(base):
    """An empty folder for one case, under the module's folder (``case.parents[1]`` is ``base``)."""
    target = base / "cases" / f"c{next(_CASES)}"
    target.mkdir(parents=True)
    return target


@pytest.mark.parametrize("kind", sorted(BAD_AUDIO))
@pytest.mark.parametrize("command", ["info", "train", "evaluate", "evaluate-m", "classify", "features"])
def test_bad_audio(capsys, base, case, kind, command):
    if command == "info" and kind in DECODED_ONLY:
        pytest.skip("info reads headers only; the samples are checked when they are decoded")
    data, bad = _bad_set(case, kind)
    argv = {
        "info": ["info", str(data)],
        "train": ["train", "--data", str(data), "--label", "state", "--model", "gmm", "--set", "components=2",
                  "-o", str(case / "m.wt")],
        "evaluate": ["evaluate", "--data", str(data), "--label", "state", "--set", "components=2",
                     "--folds", "2"],
        "evaluate-m": ["evaluate", "-m", str(base / "model.wt"), "--data", str(data), "--label", "state"],
        "classify": ["classify", "-m", str(base / "model.wt"), str(bad)],
        "features": ["features", "--data", str(data), "--features", "logmel(bands=16)", "-o", str(case / "f")],
    }[command]
    if command != "info":
        argv += ["--no-progress"] if command != "features" else []
    _check(capsys, case, argv, bad.name)


@pytest.mark.parametrize("kind", ["truncated", "nan", "too-short", "one-hz", "empty"])
def test_skip_bad_names_the_skipped_file(capsys, base, case, kind):
    """With --skip-bad the run succeeds and says which recording it skipped and why."""
    data, bad = _bad_set(case, kind)
    for argv in (["train", "--data", str(data), "--label", "state", "--model", "gmm", "--set", "components=2",
                  "-o", str(case / "m.wt"), "--skip-bad"],
                 ["evaluate", "--data", str(data), "--label", "state", "--set", "components=2", "--folds", "2",
                  "--skip-bad", "--json"],
                 ["evaluate", "-m", str(base / "model.wt"), "--data", str(data), "--label", "state",
                  "--skip-bad", "--json"]):
        capsys.readouterr()
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert "skipped 1 bad recording:" in err and bad.name in err, err
        if "--json" in argv:
            res = json.loads(out)
            assert res["skipped"] == 1 and res["recordings"] == 12
            if "folds" in res:
                assert sum(f["test_recordings"] for f in res["folds"]) == 12


# ---- metadata ------------------------------------------------------------------------------------
def _meta(text: str | bytes):
    def make(data: Path, good: Path) -> None:
        content = text if isinstance(text, bytes) else text.replace("GOOD", str(good / "healthy0.wav"))
        (data / "metadata.csv").write_bytes(content if isinstance(content, bytes) else content.encode())
    return make


BAD_METADATA = {
    # kind: (writer, what the message must name)
    "nul-byte": (_meta("GOOD,state=healthy\nGO\0OD,state=loose\n"), "metadata.csv:2"),
    "huge-field": (_meta("GOOD,state=" + "x" * 140000 + "\n"), "metadata.csv:1"),
    "four-columns": (_meta("GOOD,state=healthy,mic=1,extra\n"), "metadata.csv:1"),
    "label-without-equals": (_meta("GOOD,state=healthy\nGOOD,healthy\n"), "metadata.csv:2"),
    "empty-label-name": (_meta("GOOD,=healthy\n"), "metadata.csv:1"),
    "bad-tags": (_meta("GOOD,state=healthy,mic\n"), "metadata.csv:1"),
    "open-segment": (_meta("GOOD[100-],state=healthy\n"), "metadata.csv:1"),
    "reversed-segment": (_meta("GOOD[500-100],state=healthy\n"), "metadata.csv:1"),
    "segment-outside": (_meta("GOOD[0-99000],state=healthy\n"), "metadata.csv:1"),
    "empty-file-name": (_meta(",state=healthy\n"), "metadata.csv:1"),
    "latin-1": (_meta("GOOD,state=h\xe9althy\n".encode("latin-1")), "metadata.csv"),
    "binary": (_meta(bytes(range(1, 256)) * 4), "metadata.csv"),
    "only-comments": (_meta("# nothing here\n\n"), "metadata.csv"),
    "empty": (_meta(""), "metadata.csv"),
    "header-only": (_meta("file,labels,tags\n"), "metadata.csv"),
    "missing-file": (_meta("GOOD,state=healthy\nnot-there.wav,state=loose\n"), "not-there.wav"),
}


@pytest.mark.parametrize("kind", sorted(BAD_METADATA))
@pytest.mark.parametrize("command", ["info", "train", "evaluate", "memory"])
def test_bad_metadata(capsys, base, case, kind, command):
    data = case / "data"
    data.mkdir()
    make, expect = BAD_METADATA[kind]
    make(data, base / "good")
    argv = {
        "info": ["info", str(data)],
        "train": ["train", "--data", str(data), "--label", "state", "--model", "gmm", "-o", str(case / "m.wt")],
        "evaluate": ["evaluate", "--data", str(data), "--label", "state", "--folds", "2"],
        "memory": ["memory", "--data", str(data), "--label", "state", "--model", "gmm"],
    }[command]
    _check(capsys, case, argv, expect)


DATA_ERRORS = {
    # kind: (argv after the command's own, expected text); {good} is the good data set
    "no-such-path": (["--data", "{case}/nowhere", "--label", "state"], "nowhere"),
    "folder-without-audio": (["--data", "{case}", "--label", "state"], "no metadata.csv"),
    "unknown-label": (["--data", "{good}", "--label", "colour"], "colour"),
    "empty-label": (["--data", "{good}", "--label", ""], "''"),
}


@pytest.mark.parametrize("kind", sorted(DATA_ERRORS))
@pytest.mark.parametrize("command", ["train", "evaluate", "memory"])
def test_bad_data_argument(capsys, base, case, kind, command):
    rest, expect = DATA_ERRORS[kind]
    rest = [a.format(good=base / "good", case=case) for a in rest]
    argv = [command, *rest, "--model", "gmm"] + (["-o", f"{case}-m.wt"] if command == "train" else [])
    if command == "memory" and kind == "empty-label":
        pytest.skip("memory takes --label only to count values; an empty one means none")
    _check(capsys, case, argv, expect)


def test_one_label_value_cannot_train(capsys, base, case):
    data = case / "data"
    data.mkdir()
    (data / "metadata.csv").write_text("".join(f"{base / 'good' / f'healthy{i}.wav'},state=healthy\n"
                                               for i in range(3)))
    _check(capsys, case, ["train", "--data", str(data), "--label", "state", "--model", "gmm", "-o",
                          str(case / "m.wt")], "at least 2 label values")


@pytest.mark.parametrize("argv,expect", [
    (["--folds", "20"], "folds=20"),
    (["--group-by", "colour"], "colour"),
    (["--group-by", "machine", "--folds", "3"], "folds=3"),
])
def test_bad_fold_settings(capsys, base, case, argv, expect):
    _check(capsys, case, ["evaluate", "--data", str(base / "good"), "--label", "state", *argv], expect)


# ---- parameters ----------------------------------------------------------------------------------
BAD_PARAMETERS = [
    # (extra arguments, expected text)
    (["--set", "colour=red"], "colour"),
    (["--set", "components"], "--set 'components'"),
    (["--set", "components=0"], "components"),
    (["--set", "components=-3"], "components"),
    (["--set", "components=abc"], "components"),
    (["--set", "components=1.5"], "components"),
    (["--set", "components=1e9"], "components"),
    (["--set", "reg=-1"], "reg"),
    (["--set", "tol=nan"], "tol"),
    (["--set", "tol=-1"], "tol"),
    (["--set", "max_iter=0"], "max_iter"),
    (["--set", "seed=-1"], "seed"),
    (["--set", "accelerate=maybe"], "accelerate"),
    (["--set", "unknown_sd=-1"], "unknown_sd"),
    (["--set", "frame_cache_mb=-1"], "frame_cache_mb"),
    (["--set", "init_frames=0"], "init_frames"),
    (["--set", "pad=sideways"], "pad"),
    (["--set", "clip_ms=-5"], "clip_ms"),
    (["--features", ""], "empty spec"),
    (["--features", "nosuch"], "nosuch"),
    (["--features", "logmel(band=64)"], "band"),
    (["--features", "logmel(bands=0)"], "bands"),
    (["--features", "logmel(bands=abc)"], "bands"),
    (["--features", "logmel("], "column"),
    (["--features", "logmel | nosuch"], "nosuch"),
    (["--features", "delta"], "delta"),
    (["--features", "logmel(window_ms=-1)"], "window_ms"),
    (["--features", "logmel(shift_pct=0)"], "shift_pct"),
    (["--features", "logmel(rate=0)"], "rate"),
    (["--features", "logmel(n_fft=16)"], "n_fft"),
    (["--features", "fft(whole=true)"], "bins"),
    (["--features", "identity(whole=true)"], "window_ms"),
    (["--features", "logmel(window_ms=900)"], "shorter than one"),
    (["--features", "mfcc(bands=10, coeffs=40)"], "coeffs"),
    (["--features", "logmel(bands=8, whole=true)", "--clip-ms", "100"], "clip_ms=100"),
    (["--clip-ms", "-1"], "--clip-ms"),
    (["--clip-ms", "abc"], "--clip-ms"),
    (["--clip-ms", "1e8"], "--clip-ms"),
    (["--clip-ms", "600000"], "clip_ms=600000"),
    (["--clip-ms", "100000000"], "clip_ms=100000000"),
    (["--clip-ms", "900", "--pad", "none"], "clip_ms=900"),
    (["--clip-shift-ms", "-1"], "--clip-shift-ms"),
    (["--pad", "sideways"], "--pad"),
    (["--workers", "0"], "--workers"),
    (["--workers", "-1"], "--workers"),
    (["--workers", "two"], "--workers"),
    (["--batch-windows", "0"], "--batch-windows"),
    (["--memory-limit", "lots"], "lots"),
    (["--memory-limit", "-5M"], "--memory-limit"),
    (["--memory-limit", "1K"], "limit of 1K"),
    (["--memory-cache", "big"], "big"),
    (["--cache-limit", "huge"], "--cache-limit"),
    (["--cache-limit", "-1"], "--cache-limit"),
    (["--cache", ""], "--cache"),
    (["--store-dtype", "float64"], "--store-dtype"),
    (["--device", "tpu"], "--device"),
    (["--model", "nosuch"], "nosuch"),
    (["--model", "nosuch.toml"], "nosuch.toml"),
    (["--model", "{case}/bad.toml"], "bad.toml"),
    (["--model", "{case}/nomodel.toml"], "nomodel.toml"),
    (["--model", "{case}/badparam.toml"], "components"),
    (["--model", "cnn", "--set", "epochs=0"], "epochs"),
    (["--model", "cnn", "--set", "batch_size=0"], "batch_size"),
    (["--model", "cnn", "--set", "lr=0"], "lr"),
    (["--model", "cnn", "--set", "optimizer=rmsprop"], "optimizer"),
    (["--model", "cnn", "--set", "valid_fraction=0.9"], "valid_fraction"),
    (["--model", "dcase", "--set", "dropout=2"], "dropout"),
]


def _toml_files(case: Path) -> None:
    (case / "bad.toml").write_text("model = 'gmm\ncomponents = \n")
    (case / "nomodel.toml").write_text("components = 4\n")
    (case / "badparam.toml").write_text("model = 'gmm'\ncomponents = 'many'\n")


@pytest.mark.parametrize("extra,expect", BAD_PARAMETERS, ids=[" ".join(a) for a, _ in BAD_PARAMETERS])
@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_bad_parameters(capsys, base, case, command, extra, expect):
    _toml_files(case)
    extra = [a.format(case=case) for a in extra]
    model = [] if "--model" in extra else ["--model", "gmm"]
    argv = [command, "--data", str(base / "good"), "--label", "state", *model, *extra, "--no-progress"]
    if command == "train":
        argv += ["-o", str(case / "m.wt")]
    else:
        argv += ["--folds", "2"]
    _check(capsys, case, argv, expect)


@pytest.mark.parametrize("extra,expect", [
    (["--folds", "1"], "--folds"), (["--folds", "abc"], "--folds"), (["--folds", "0"], "--folds"),
    (["--seed", "-1"], "--seed"), (["--seed", "x"], "--seed"),
])
def test_bad_evaluate_settings(capsys, base, case, extra, expect):
    _check(capsys, case, ["evaluate", "--data", str(base / "good"), "--label", "state", *extra], expect)


@pytest.mark.parametrize("extra,expect", [
    (["--memory-limit", "1K"], "limit of 1K"), (["--memory-limit", "x"], "'x'"), (["--workers", "0"], "--workers"),
    (["--batch-windows", "-2"], "--batch-windows"), (["--set", "components=0"], "components"),
    (["--features", "logmel(bands=0)"], "bands"), (["--clip-ms", "600000"], "clip_ms=600000"),
    (["--cache-limit", "x"], "--cache-limit"), (["--model", "nosuch"], "nosuch"),
])
def test_bad_memory_settings(capsys, base, case, extra, expect):
    model = [] if "--model" in extra else ["--model", "gmm"]
    _check(capsys, case, ["memory", "--data", str(base / "good"), "--label", "state", *model, *extra], expect)


def test_memory_json_when_the_limit_does_not_fit(capsys, base, case):
    """memory --json still prints the smallest plan found, then the one-line error."""
    capsys.readouterr()
    code = main(["memory", "--data", str(base / "good"), "--model", "gmm", "--memory-limit", "1K", "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and "limit of 1K" in err
    plan = json.loads(out)
    assert plan["fits"] is False and plan["predicted_peak_mb"] > 0 and "limit of 1K" in plan["error"]


@pytest.mark.parametrize("extra,expect", [
    (["--checkpoint", "{case}/ck"], "checkpoint"), (["--resume", "{case}/ck"], "resume"),
])
def test_checkpoints_are_refused_for_gmm(capsys, base, case, extra, expect):
    extra = [a.format(case=case) for a in extra]
    from wavetrain.models.registry import families_with

    # the families that checkpoint are named from their tags, not from a list in the message's code
    _check(capsys, case, ["train", "--data", str(base / "good"), "--label", "state", "--model", "gmm", *extra,
                          "-o", str(case / "m.wt")],
           "checkpoint and resume folders apply to " + ", ".join(families_with(supports_checkpoints=True)))


@pytest.mark.parametrize("argv,expect", [
    (["features", "--data", "{good}", "--features", "nosuch", "-o", "{case}/f"], "nosuch"),
    (["features", "--data", "{good}", "--features", "logmel", "--device", "tpu", "-o", "{case}/f"], "--device"),
    (["plot", "{good}/healthy0.wav", "--features", "logmel(bands=0)", "-o", "{case}/p.png"], "bands"),
    (["plot", "{good}/metadata.csv", "-o", "{case}/p.png"], "metadata.csv"),
    (["plot", "{good}", "-o", "{case}/p.png"], "good"),
    (["plot", "{case}/none.wav", "-o", "{case}/p.png"], "none.wav"),
    (["info", "{case}/none"], "none"),
    (["models", "nosuch"], "nosuch"),
    (["cache", "info", "--cache", ""], "--cache"),
    (["cache", "clear", "--cache", ""], "--cache"),
    (["cache", "info", "--cache", "{case}/no-store"], "no-store"),
    (["cache", "clear", "--cache", "{good}"], "not a wavetrain feature cache"),
    (["nosuchcommand"], "nosuchcommand"),
    (["train"], "required"),
    (["classify"], "required"),
])
def test_other_commands(capsys, base, case, argv, expect):
    argv = [a.format(good=base / "good", case=case) for a in argv]
    _check(capsys, case, argv, expect)


# ---- model files ---------------------------------------------------------------------------------
def _model_parts(base: Path) -> tuple[dict, dict]:
    with np.load(base / "model.wt", allow_pickle=False) as z:
        meta = json.loads(z["__meta__"].tobytes().decode())
        weights = {k[2:]: z[k] for k in z.files if k.startswith("w/")}
    return meta, weights


def _write_model(path: Path, meta, weights: dict, raw_meta: bytes | None = None) -> None:
    arrays = {"__meta__": np.frombuffer(raw_meta if raw_meta is not None else json.dumps(meta).encode(), np.uint8)}
    arrays.update({"w/" + k: v for k, v in weights.items()})
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _edit(**changes):
    def make(path: Path, base: Path) -> None:
        meta, weights = _model_parts(base)
        for k, v in changes.items():
            if v is _DROP:
                meta.pop(k)
            else:
                meta[k] = v
        _write_model(path, meta, weights)
    return make


def _weights(fn):
    def make(path: Path, base: Path) -> None:
        meta, weights = _model_parts(base)
        fn(weights)
        _write_model(path, meta, weights)
    return make


_DROP = object()


def _pickled(path: Path, base: Path) -> None:
    meta, weights = _model_parts(base)
    arrays = {"__meta__": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
    arrays.update({"w/" + k: v for k, v in weights.items()})
    arrays["w/means"] = np.array([{"evil": 1}], dtype=object)
    with open(path, "wb") as f:
        np.savez(f, allow_pickle=True, **arrays)


BAD_MODELS = {
    "empty": lambda p, b: p.write_bytes(b""),
    "text": lambda p, b: p.write_text("not a model"),
    "random": lambda p, b: p.write_bytes(np.random.default_rng(1).integers(0, 256, 4000, np.uint8).tobytes()),
    "truncated": lambda p, b: p.write_bytes((b / "model.wt").read_bytes()[:300]),
    "zip-without-meta": lambda p, b: _zip_bytes(p),
    "meta-not-json": lambda p, b: _write_model(p, None, _model_parts(b)[1], raw_meta=b"{not json"),
    "meta-not-utf8": lambda p, b: _write_model(p, None, _model_parts(b)[1], raw_meta=b"\xff\xfe\x00"),
    "meta-array": lambda p, b: _write_model(p, [1, 2], _model_parts(b)[1]),
    "wrong-format": _edit(format="something-else"),
    "version-abc": _edit(format_version="abc"),
    "version-null": _edit(format_version=None),
    "version-negative": _edit(format_version=-1),
    "version-newer": _edit(format_version=99),
    "unknown-family": _edit(model="nosuch"),
    "params-list": _edit(params=[1, 2]),
    "params-unknown": _edit(params={"colour": "red"}),
    "params-bad-value": _edit(params={"components": "many"}),
    "labels-int": _edit(labels=3),
    "labels-empty": _edit(labels=[]),
    "labels-duplicate": _edit(labels=["healthy", "healthy", "loose"]),
    "labels-too-few": _edit(labels=["healthy", "loose"]),
    "labels-too-many": _edit(labels=["healthy", "loose", "bearing", "other"]),
    "feature-dim-zero": _edit(feature_dim=0),
    "feature-dim-text": _edit(feature_dim="x"),
    "feature-dim-wrong": _edit(feature_dim=7),
    "feature-rate-text": _edit(feature_rate="fast"),
    "channels-negative": _edit(channels=-1),
    "history-string": _edit(history="garbage"),
    "history-nested": _edit(history=[{"iteration": {"a": 1}}]),
    "no-labels-key": _edit(labels=_DROP),
    "no-model-key": _edit(model=_DROP),
    "weights-missing": _weights(lambda w: w.pop("means")),
    "weights-wrong-shape": _weights(lambda w: w.__setitem__("means", w["means"][:, :1])),
    "weights-nan": _weights(lambda w: w["means"].__setitem__((0, 0, 0), np.nan)),
    "weights-inf": _weights(lambda w: w["variances"].__setitem__((0, 0, 0), np.inf)),
    "weights-negative-variance": _weights(lambda w: w.__setitem__("variances", -w["variances"])),
    "weights-text": _weights(lambda w: w.__setitem__("weights", np.array(["a", "b"]))),
    "weights-pickle": _pickled,
    "a-folder": lambda p, b: p.mkdir(),
    "missing": lambda p, b: None,
}


@pytest.mark.parametrize("kind", sorted(BAD_MODELS))
@pytest.mark.parametrize("command", ["classify", "evaluate", "info"])
def test_bad_model_file(capsys, base, case, kind, command):
    path = case / "bad.wt"
    BAD_MODELS[kind](path, base)
    argv = {
        "classify": ["classify", "-m", str(path), str(base / "good" / "healthy0.wav")],
        "evaluate": ["evaluate", "-m", str(path), "--data", str(base / "good"), "--label", "state"],
        "info": ["info", str(path)],
    }[command]
    _check(capsys, case, argv, "bad.wt")


def test_model_name_given_as_model_file_gets_a_hint(capsys, base, case):
    line = _check(capsys, case, ["evaluate", "-m", "gmm", "--data", str(base / "good"), "--label", "state"],
                  "--model")
    assert "model name" in line


def test_per_axis_model_refuses_another_channel_layout(capsys, base, case):
    _check(capsys, case, ["classify", "-m", str(base / "axis.wt"), str(base / "good" / "healthy0.wav")],
           ("healthy0.wav", "channel"))


# ---- output paths --------------------------------------------------------------------------------
def _train(base: Path, out: str) -> list[str]:
    return ["train", "--data", str(base / "good"), "--label", "state", "--model", "gmm", "--set",
            "components=2", "-o", out]


@pytest.mark.parametrize("target,expect", [
    ("", "empty path"),
    ("{case}", "is a folder"),
    ("{case}/missing/m.wt", "does not exist"),
    ("/dev/null", "is a device"),
    ("{case}/link.wt", "symbolic link"),
    ("{case}/fifo.wt", "named pipe"),
    ("{case}/afile/m.wt", "is not a folder"),
])
def test_bad_model_output(capsys, base, case, target, expect):
    (case / "target.wt").write_text("x")
    (case / "link.wt").symlink_to(case / "target.wt")
    os.mkfifo(case / "fifo.wt")
    (case / "afile").write_text("x")
    _check(capsys, case, _train(base, target.format(case=case)), expect)
    assert (case / "target.wt").read_text() == "x" and (case / "link.wt").is_symlink()


@pytest.mark.parametrize("argv,expect", [
    (["demo", "-o", "{case}/afile"], "not a folder"),
    (["demo", "-o", ""], "empty path"),
    (["features", "--data", "{good}", "--features", "logmel", "-o", "{case}/afile"], "not a folder"),
    (["features", "--data", "{good}", "--features", "logmel", "-o", ""], "empty path"),
    (["plot", "{good}/healthy0.wav", "-o", "{case}/p.txt"], "p.txt"),
    (["plot", "{good}/healthy0.wav", "-o", "{case}"], "is a folder"),
    (["plot", "{good}/healthy0.wav", "-o", "/dev/null"], "/dev/null"),
    (["plot-history", "-m", "{model}", "-o", "{case}/missing/h.png"], "does not exist"),
    (["train", "--data", "{good}", "--label", "state", "--model", "cnn", "--checkpoint", "{case}/afile", "-o",
      "{case}/m.wt"], "--checkpoint"),
])
def test_bad_output_paths_of_other_commands(capsys, base, case, argv, expect):
    (case / "afile").write_text("x")
    argv = [a.format(good=base / "good", case=case, model=base / "model.wt") for a in argv]
    _check(capsys, case, argv, expect)


def _mount_read_only(folder: Path) -> bool:
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(folder)], check=True,
                       capture_output=True, timeout=10)
        return True
    except (OSError, subprocess.SubprocessError):
        return False


def test_model_output_on_a_read_only_mount(capsys, base, case):
    ro = case / "ro"
    ro.mkdir()
    if not _mount_read_only(ro):
        pytest.skip("cannot mount a read-only tmpfs here (needs root)")
    try:
        _check(capsys, case, _train(base, str(ro / "m.wt")), ("m.wt", "Read-only"))
    finally:
        subprocess.run(["umount", str(ro)], check=False, capture_output=True, timeout=10)


def test_a_full_disk_while_writing_the_model_is_one_line(capsys, base, case, monkeypatch):
    """ENOSPC at the end of training: one line, the old model file untouched, no temporary file."""
    import errno

    import wavetrain.core.outputs as outputs

    target = case / "m.wt"
    target.write_text("previous model")
    real = os.replace

    def full(src, dst, *a, **kw):
        if str(dst) == str(target):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(outputs.os, "replace", full)
    _check(capsys, case, _train(base, str(target)), ("m.wt", "No space left"))
    assert target.read_text() == "previous model"
