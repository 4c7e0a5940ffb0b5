"""Damaged and hostile model files through the command line: ``info``, ``classify``,
``evaluate -m``, ``plot history`` and ``serve`` share one validation, so each refuses the same file
with the same one line (exit code 2, no traceback), and no message suggests loading unsafely."""
from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import main
from wavetrain.models import load_model

RATE = 16000


def _tone(freq: float, seconds: float = 0.5) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    noise = 0.01 * np.random.default_rng(int(freq)).normal(size=t.size)
    return (0.3 * np.sin(2 * np.pi * freq * t) + noise).astype(np.float32)


@pytest.fixture(scope="module")
def base(tmp_path_factory, monkeypatch_module):
    """``data/``: 6 tones of two values; ``model.wt``: a tiny gmm trained on them."""
    root = tmp_path_factory.mktemp("model-files")
    data = root / "data"
    data.mkdir()
    rows = []
    for i in range(6):
        value = ("low", "high")[i % 2]
        sf.write(data / f"t{i}.wav", _tone((300, 1500)[i % 2] + 11 * i), RATE)
        rows.append(f"t{i}.wav,pitch={value}\n")
    (data / "metadata.csv").write_text("".join(rows))
    monkeypatch_module.setenv("WAVETRAIN_CACHE", str(root / "cache"))
    assert main(["train", "--data", str(data), "--label", "pitch", "--model", "gmm", "--set", "components=2",
                 "--features", "logmel(bands=8)", "-o", str(root / "model.wt")]) == 0
    return root


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _parts(path: Path) -> tuple[dict, dict]:
    with np.load(path, allow_pickle=False) as z:
        return (json.loads(z["__meta__"].tobytes().decode()),
                {k: z[k] for k in z.files if k != "__meta__"})


def _rewrite(good: Path, out: Path, meta_edit=None, weights_edit=None) -> None:
    meta, arrays = _parts(good)
    if meta_edit:
        meta_edit(meta)
    if weights_edit:
        weights_edit(arrays)
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(out, "wb") as f:
        np.savez(f, **arrays)


def _pickled_model(good: Path, out: Path) -> None:
    out.write_bytes(pickle.dumps(load_model(good)))


def _object_arrays(good: Path, out: Path) -> None:
    with open(out, "wb") as f:
        np.savez(f, __meta__=np.array([{"format": "wavetrain-model"}], dtype=object))


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _zeros_members(good: Path, out: Path, n: int) -> None:
    """The model plus ``n`` members of 1 MB of zeros, deflated."""
    import zipfile

    zeros = _npy(np.zeros(1 << 17))
    with zipfile.ZipFile(good) as z, zipfile.ZipFile(out, "w") as o:
        for info in z.infolist():
            o.writestr(info, z.read(info))
        for i in range(n):
            o.writestr(f"w/extra{i}.npy", zeros, compress_type=zipfile.ZIP_DEFLATED)


def _set_param(key, value):
    return lambda g, o: _rewrite(g, o, meta_edit=lambda m: m["params"].__setitem__(key, value))


def _edit_weight(key, fn):
    return lambda g, o: _rewrite(g, o, weights_edit=lambda w: w.__setitem__(f"w/{key}", fn(w[f"w/{key}"])))


#: name -> (write the bad file from the good one, words the error line must hold)
BAD = {
    "raw-pickle": (lambda g, o: o.write_bytes(pickle.dumps({"model": "gmm"})), "not a readable wavetrain model file"),
    "pickled-model": (_pickled_model, "not a readable wavetrain model file"),
    "npy-array": (lambda g, o: o.write_bytes(_npy(np.arange(4.0))), "not a readable wavetrain model file"),
    "object-arrays": (_object_arrays, "Python objects"),
    "labels-appended": (lambda g, o: _rewrite(g, o, meta_edit=lambda m: m["labels"].append("extra")), "shape"),
    "clip-ms-1e15": (_set_param("clip_ms", 1e15), "clip_ms"),
    "weights-integers": (_edit_weight("means", lambda a: np.round(a).astype(np.int64)), "int64"),
    "weights-1e300": (_edit_weight("means", lambda a: np.full(a.shape, 1e300)), "large"),
    "versions-a-list": (lambda g, o: _rewrite(g, o, meta_edit=lambda m: m.__setitem__("versions", [1])),
                        "versions"),
    "label-unknown": (lambda g, o: _rewrite(g, o, meta_edit=lambda m: m["labels"].__setitem__(0, "unknown")),
                      "'unknown'"),
    "label-escape": (lambda g, o: _rewrite(g, o, meta_edit=lambda m: m["labels"].__setitem__(0, "\x1b[2Jx")),
                     "control characters"),
    "created-escape": (lambda g, o: _rewrite(g, o, meta_edit=lambda m: m.__setitem__("created", "\x1b[2J")),
                       "control characters"),
    "weights-times-1e20": (lambda g, o: _rewrite(g, o, weights_edit=lambda w: w.update(
        {k: v * 1e20 for k, v in w.items() if k.startswith("w/")})), "large"),
    "extra-array": (lambda g, o: _rewrite(g, o, weights_edit=lambda w: w.__setitem__("w/extra", np.ones(3))),
                    "no part of"),
    "members-of-zeros": (lambda g, o: _zeros_members(g, o, 800), "would unpack"),
}


def _argv(command: str, model: Path, base: Path, tmp: Path) -> list[str]:
    data = base / "data"
    return {
        "info": ["info", str(model)],
        "classify": ["classify", "-m", str(model), str(data / "t0.wav")],
        "evaluate": ["evaluate", "-m", str(model), "--data", str(data), "--label", "pitch"],
        "plot-history": ["plot", "history", "-m", str(model), "-o", str(tmp / "h.png")],
        "serve": ["serve", "-m", str(model), "--host", "127.0.0.1", "--port", "0"],
    }[command]


def _error_line(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, f"exit code {code}, stderr: {err!r}"
    assert "Traceback" not in err and len(lines) == 1, f"expected one line, got: {err!r}"
    assert lines[0].startswith("wavetrain: error: ")
    assert "allow_pickle" not in err and "unsafe" not in err.lower() and "trust" not in err.lower()
    assert "\x1b" not in out + err
    return lines[0]


@pytest.mark.parametrize("kind", sorted(BAD))
def test_every_command_refuses_in_the_same_line(capsys, base, tmp_path, kind):
    write, words = BAD[kind]
    bad = tmp_path / "bad.wt"
    write(base / "model.wt", bad)
    seen = {}
    for command in ("info", "classify", "evaluate", "plot-history", "serve"):
        seen[command] = _error_line(capsys, _argv(command, bad, base, tmp_path))
        assert words in seen[command], f"{command}: {seen[command]}"
        assert str(bad) in seen[command]
    assert len(set(seen.values())) == 1, seen
    assert not (tmp_path / "h.png").exists()


def test_the_good_model_works_everywhere(capsys, base, tmp_path):
    assert main(["info", str(base / "model.wt")]) == 0
    assert main(["classify", "-m", str(base / "model.wt"), str(base / "data" / "t1.wav")]) == 0
    assert main(["plot", "history", "-m", str(base / "model.wt"), "-o", str(tmp_path / "h.png")]) == 0
    assert (tmp_path / "h.png").stat().st_size > 0


def test_info_json_of_a_damaged_file_is_the_error_line(capsys, base, tmp_path):
    bad = tmp_path / "bad.wt"
    BAD["labels-appended"][0](base / "model.wt", bad)
    line = _error_line(capsys, ["info", "--json", str(bad)])
    assert "damaged" in line or "do not fit" in line
