"""Same data and seed, same model: model files trained by this code equal those the previous code
wrote (``tests/golden/models.json``: per weight array its shape, sums and a sample of values,
plus the metadata that does not vary between runs).

A refactor that changes no behaviour passes this test unchanged. A change that is meant to alter
results regenerates the file (``WAVETRAIN_REGEN_GOLDEN=1 pytest tests/test_golden_models.py``) and
says why in its commit.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from wavetrain.cli.main import main
from wavetrain.models.modelfile import read_model_file

GOLDEN = Path(__file__).parent / "golden" / "models.json"
#: Model specs trained on the demo data (1 s clips, 3 machine states), each with its settings.
RUNS = {
    "gmm": ["--model", "gmm", "--set", "components=4"],
    "gmm-speech": ["--model", "gmm-speech", "--set", "components=4", "--set", "accelerate=false"],
    "gmm-clips": ["--model", "gmm", "--set", "components=2", "--clip-ms", "400", "--clip-shift-ms", "200"],
    # every EM pass re-reads the stream (frames not kept in memory)
    "gmm-streamed": ["--model", "gmm", "--set", "components=3", "--set", "frame_cache_mb=0"],
    "cnn": ["--model", "cnn", "--features", "logmel(bands=16)", "--set", "epochs=2", "--set", "batch_size=8",
            "--set", "valid_fraction=0.25", "--group-by", "machine"],
    "dcase": ["--model", "dcase", "--features", "logmel(bands=16)", "--set", "epochs=1", "--set", "batch_size=8",
              "--set", "valid_fraction=0"],
}
#: Metadata that differs from run to run (clock, timings, versions).
VOLATILE = {"created", "versions", "training"}
VOLATILE_HISTORY = {"seconds", "samples_per_s", "data_wait_fraction"}
SAMPLE = 16


def _digest(path: Path) -> dict:
    meta, weights = read_model_file(path)
    out = {k: v for k, v in meta.items() if k not in VOLATILE and k != "history"}
    out["history"] = [{k: v for k, v in h.items() if k not in VOLATILE_HISTORY} for h in meta["history"]]
    arrays = {}
    for name, a in sorted(weights.items()):
        flat = np.asarray(a, dtype=np.float64).ravel()
        idx = np.linspace(0, flat.size - 1, min(SAMPLE, flat.size)).astype(int) if flat.size else []
        arrays[name] = {"shape": list(a.shape), "sum": float(flat.sum()), "abs_sum": float(np.abs(flat).sum()),
                        "sample": [float(flat[i]) for i in idx]}
    out["weights"] = arrays
    return out


#: Relative tolerance: the same arithmetic repeats exactly on one machine, but numpy and OpenBLAS
#: pick other SIMD kernels on other CPUs (AVX2, AVX-512), and EM's iterations carry their rounding
#: to ~5e-5 of a mean near zero; torch's CPU convolutions may also pick other algorithms after
#: other networks ran in the same process. A change in behaviour moves values far more.
RTOL = 1e-4


def _close(a, b, where: str, rel: float = 1e-6) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _close(a[k], b[k], f"{where}.{k}", rel)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{where}: {a} != {b}"
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]", rel)
    elif isinstance(a, float) and isinstance(b, (int, float)):
        assert b == pytest.approx(a, rel=rel, abs=rel * 1e-3), f"{where}: {b} != {a}"
    else:
        assert a == b, f"{where}: {b!r} != {a!r}"


@pytest.fixture(scope="module")
def digests(demo_csv, tmp_path_factory):
    out = {}
    cache = tmp_path_factory.mktemp("golden-cache")
    for name, args in RUNS.items():
        path = tmp_path_factory.mktemp("golden") / f"{name}.wt"
        assert main(["train", "--data", str(demo_csv), "--label", "state", *args, "--cache", str(cache),
                     "--no-progress", "-o", str(path)]) == 0
        out[name] = _digest(path)
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_same_data_and_seed_give_the_same_model(digests, name):
    if os.environ.get("WAVETRAIN_REGEN_GOLDEN"):
        known = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        known[name] = digests[name]
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
        pytest.skip("golden file regenerated")
    golden = json.loads(GOLDEN.read_text())[name]
    _close(golden, digests[name], name, RTOL)
