"""A lean install: what ``make setup`` installs runs the core commands, and a command that needs a
missing extra says which one and how to add it, in one line with exit code 2.

The commands run in fresh processes where the extras' modules cannot be found (as on a machine that
never installed them: ``import torch`` fails and ``importlib.util.find_spec("torch")`` is None),
so a module that imported torch or pyspark on a core command's path would fail them.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from wavetrain.core.extras import EXTRAS, MissingExtraError, has_module, import_extra, install_hint, require

ROOT = Path(__file__).resolve().parents[1]

#: Runs ``wavetrain ARGS`` with the modules of argv[1] (comma-separated) hidden from every finder.
HIDDEN_RUNNER = r"""
import sys
HIDDEN = set(sys.argv[1].split(","))

class Hidden:
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            return None
        return self.inner.find_spec(name, path, target)
    def __getattr__(self, attr):
        return getattr(self.inner, attr)

sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
sys.argv = ["wavetrain", *sys.argv[2:]]
from wavetrain.cli.main import main
sys.exit(main())
"""

#: The extras a lean install lacks (PyTorch and Spark, and the other extras with them).
LEAN_HIDDEN = ("torch", "pyspark", "py4j", "pyarrow", "pandas", "onnx", "onnxruntime", "starlette", "uvicorn",
               "openwakeword", "sklearn", "mkl_fft")


def lean(*args, cwd: Path, hidden=LEAN_HIDDEN, cache: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", WAVETRAIN_PROGRESS="0")
    if cache is not None:
        env["WAVETRAIN_CACHE"] = str(cache)
    return subprocess.run([sys.executable, "-c", HIDDEN_RUNNER, ",".join(hidden), *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def one_line_refusal(res: subprocess.CompletedProcess) -> str:
    """The single stderr line of a user error (exit code 2, no traceback)."""
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


# ---- the core commands without the extras ----------------------------------------------------------
def test_core_commands_run_without_torch_pyspark_and_the_other_extras(demo_csv, tmp_path):
    data = Path(demo_csv)
    one = data.parent / "healthy_15hz_10db_m0.wav"
    steps = [
        ("models",),
        ("models", "cnn"),                                         # described, not built: no torch needed
        ("info", data),
        ("features", "--data", data, "--features", "mfcc(coeffs=13) | delta", "-o", tmp_path / "feats"),
        ("train", "--data", data, "--label", "state", "--model", "gmm", "--set", "components=4",
         "-o", tmp_path / "m.wt"),
        ("info", tmp_path / "m.wt"),
        ("classify", "-m", tmp_path / "m.wt", one),
        ("evaluate", "--data", data, "--label", "state", "--model", "gmm", "--set", "components=4", "--folds", "2",
         "--group-by", "machine", "--plot", tmp_path / "cm.png"),
        ("train", "--data", data, "--normal", "state=healthy", "--model", "normal-dist", "-o", tmp_path / "d.wt"),
        ("sound", "partition", "--data", data, "--label", "state", "--parts", "2", "-o", tmp_path / "parts"),
        ("demo",),
    ]
    for args in steps:
        res = lean(*args, cwd=tmp_path)
        assert res.returncode == 0, (args, res.stderr[-3000:])
    assert len(list((tmp_path / "feats").glob("*.npy"))) == len(data.read_text().splitlines())
    assert "state=" in lean("classify", "-m", tmp_path / "m.wt", one, cwd=tmp_path).stdout
    assert (tmp_path / "cm.png").stat().st_size > 0 and (tmp_path / "parts" / "part1" / "metadata.csv").exists()


# ---- what needs an extra says so --------------------------------------------------------------------
def test_a_network_without_torch_is_refused_in_one_line_before_any_feature_is_extracted(demo_csv, tmp_path):
    cache = tmp_path / "cache"
    for model in ("cnn", "autoencoder"):
        res = lean("train", "--data", demo_csv, "--label", "state", "--model", model, "-o", tmp_path / "n.wt",
                   cwd=tmp_path, hidden=("torch",), cache=cache)
        line = one_line_refusal(res)
        assert f"{model} needs PyTorch" in line and "make setup-networks" in line and "wavetrain[networks]" in line
    assert not (tmp_path / "n.wt").exists()
    assert not list(cache.rglob("*.gram"))      # refused before any feature was extracted
    res = lean("train", "--data", demo_csv, "--label", "state", "--model", "ensemble", "--set", "members=gmm,cnn",
               "-o", tmp_path / "e.wt", cwd=tmp_path, hidden=("torch",))
    assert "cnn needs PyTorch" in one_line_refusal(res)


def test_torch_devices_without_torch_are_refused_not_skipped_as_bad_recordings(demo_csv, tmp_path):
    res = lean("features", "--data", demo_csv, "--features", "logmel", "--device", "cpu-torch", "--skip-bad",
               "-o", tmp_path / "f", cwd=tmp_path, hidden=("torch",))
    assert "--device cpu-torch needs PyTorch" in one_line_refusal(res)
    assert not (tmp_path / "f").exists()
    res = lean("train", "--data", demo_csv, "--label", "state", "--model", "gmm", "--devices", "auto",
               "-o", tmp_path / "m.wt", cwd=tmp_path, hidden=("torch",))
    assert "--devices auto needs PyTorch" in one_line_refusal(res)


def test_the_spark_engine_without_pyspark_is_refused_in_one_line(demo_csv, tmp_path):
    for args in (("train", "--data", demo_csv, "--label", "state", "-o", tmp_path / "m.wt"),
                 ("features", "--data", demo_csv, "--features", "logmel", "-o", tmp_path / "table")):
        res = lean(*args, "--engine", "spark", cwd=tmp_path, hidden=("pyspark", "py4j"))
        line = one_line_refusal(res)
        assert "the Spark engine needs pyspark" in line and "make setup-spark" in line and "--engine local" in line
    res = lean("train", "--data", demo_csv, "--label", "state", "--engine", "spark", "-o", tmp_path / "m.wt",
               cwd=tmp_path, hidden=("pyarrow",))
    assert "needs pyarrow" in one_line_refusal(res)


def test_a_network_model_file_without_torch_is_refused_in_one_line(demo_csv, tmp_path):
    pytest.importorskip("torch")
    from wavetrain.cli.main import main

    path = tmp_path / "cnn.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "cnn", "--set", "epochs=1",
                 "-o", str(path)]) == 0
    one = Path(demo_csv).parent / "healthy_15hz_10db_m0.wav"
    res = lean("classify", "-m", path, one, cwd=tmp_path, hidden=("torch",))
    assert "cnn needs PyTorch" in one_line_refusal(res)


def test_serving_and_export_without_their_extras_are_refused_in_one_line(demo_csv, tmp_path):
    from wavetrain.cli.main import main

    path = tmp_path / "m.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=2",
                 "-o", str(path)]) == 0
    res = lean("serve", "-m", path, "--port", "0", cwd=tmp_path, hidden=("uvicorn", "starlette"))
    assert "wavetrain serve needs" in one_line_refusal(res) and "make setup-serve" in res.stderr
    res = lean("export", "-m", path, "-o", tmp_path / "m.onnx", cwd=tmp_path, hidden=("onnx", "onnxruntime"))
    assert "export needs onnx and onnxruntime" in one_line_refusal(res) and "make setup-export" in res.stderr
    assert not (tmp_path / "m.onnx").exists()


# ---- the helper ---------------------------------------------------------------------------------------
def test_import_extra_and_require_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "openwakeword", None)      # import openwakeword -> ModuleNotFoundError
    assert not has_module("openwakeword")
    with pytest.raises(MissingExtraError, match=r"^speech_embedding needs openwakeword: install it with "
                                                r"`make setup-speech` \(or pip install 'wavetrain\[speech\]'\)$"):
        require("openwakeword", "speech_embedding")
    with pytest.raises(MissingExtraError) as e:
        import_extra("openwakeword.model", "x")
    assert e.value.extra == "speech" and e.value.module == "openwakeword"
    assert import_extra("numpy", "x") is sys.modules["numpy"]


def test_a_broken_extra_is_one_line_too(monkeypatch, tmp_path):
    (tmp_path / "sklearn").mkdir()
    (tmp_path / "sklearn" / "__init__.py").write_text("from . import _missing_compiled_part\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] == "sklearn"]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MissingExtraError, match=r"^wavetrain\.sklearn needs scikit-learn, which does not import "
                                                r"here \(.*\): reinstall it with `make setup-sklearn`"):
        import_extra("sklearn", "wavetrain.sklearn")


# ---- the requirements, the extras and the make targets agree ----------------------------------------
def _requirements(name: str) -> dict[str, str]:
    """Package -> pinned line of a requirements file, its ``-r`` includes expanded."""
    out: dict[str, str] = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            out.update(_requirements(line[3:].strip()))
        elif line:
            out[re.split(r"[=<>;\s]", line, maxsplit=1)[0].lower().replace("_", "-")] = line
    return out


def test_the_core_requirements_hold_no_extra_and_the_dev_set_up_holds_every_extra():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = pyproject["optional-dependencies"]
    makefile = (ROOT / "Makefile").read_text()
    core = _requirements("requirements.txt")
    dev = _requirements("requirements-dev.txt")
    files = sorted(p.name for p in ROOT.glob("requirements-*.txt"))
    for name in files:
        extra = name[len("requirements-"):-len(".txt")]
        assert re.search(rf"^EXTRAS := .*\b{re.escape(extra)}\b", makefile, re.M), f"no make setup-{extra}"
        if extra not in ("all", "dev"):
            assert extra in extras, f"{name} has no extra in pyproject.toml"
            pinned = _requirements(name)
            assert not set(pinned) & set(core), f"{name} repeats core requirements"
            assert set(pinned) <= set(dev), f"make setup-dev misses {name}"
    for module, (extra, _) in EXTRAS.items():
        assert extra in extras and f"requirements-{extra}.txt" in files, module
    for heavy in ("torch", "pyspark", "mkl", "mkl-fft", "pytest", "ruff", "mypy", "librosa", "onnxruntime"):
        assert heavy not in core, f"{heavy} is in the core requirements"
    assert _requirements("requirements-networks.txt")["torch"] == "torch==2.13.0"
    assert "torch==2.13.0" in extras["networks"]
    assert not any(d.split(">")[0].split("=")[0].strip().lower() in ("torch", "pyspark", "mkl-fft", "mkl_fft")
                   for d in pyproject["dependencies"])
    assert re.search(r"^demo: setup$", makefile, re.M) and re.search(r"^test: setup-dev$", makefile, re.M)
    assert install_hint("networks") == "install it with `make setup-networks` (or pip install 'wavetrain[networks]')"
