import json
import subprocess
import sys

import numpy as np
import pytest

from wavetrain.cli.main import main
from wavetrain.core.errors import MemoryLimitError
from wavetrain.data import load_dataset
from wavetrain.models import build
from wavetrain.pipeline.memory import MB, plan


def test_plan_components_and_settings(demo_csv):
    ds = load_dataset(demo_csv)
    p = plan(ds, build("gmm"), baseline_rss=50 * MB)
    c = p.components_mb
    assert c["runtime"] >= 50
    # with a feature store, extraction (audio + extraction) and fitting (model) do not overlap
    overlap = min(c["audio"] + c["extraction"], c["model"])
    assert p.phased and p.predicted_peak_mb == pytest.approx(sum(c.values()) - overlap, abs=0.5)
    q = plan(ds, build("gmm"), baseline_rss=50 * MB, persistent_store=False)
    assert not q.phased and q.predicted_peak_mb == pytest.approx(sum(q.components_mb.values()), abs=0.5)
    assert q.predicted_peak_mb > p.predicted_peak_mb
    assert {"batch_windows", "workers", "prefetch", "cache_mb"} <= set(p.settings)
    assert p.data["recordings"] == len(ds)


def test_limit_reduces_settings_or_refuses(demo_csv):
    ds = load_dataset(demo_csv)
    roomy = plan(ds, build("gmm"), memory_limit=1 << 30, workers=2, baseline_rss=50 * MB)
    assert roomy.settings["workers"] == 2
    with pytest.raises(MemoryLimitError, match=r"it would fit with a limit of \d+M"):
        plan(ds, build("gmm"), memory_limit=20 * MB, baseline_rss=50 * MB)


def test_memory_command_json(capsys, demo_csv):
    assert main(["memory", "--data", str(demo_csv), "--model", "gmm", "--label", "state", "--json"]) == 0
    out = json.loads(capsys.readouterr()[0])
    assert out["predicted_peak_mb"] > 0 and "model" in out["components_mb"]


def test_refusal_is_a_one_line_error(capsys, demo_csv, tmp_path):
    code = main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--memory-limit", "10M",
                 "-o", str(tmp_path / "m.wt")])
    err = capsys.readouterr()[1]
    assert code == 2 and "would fit with a limit of" in err and not (tmp_path / "m.wt").exists()


CHILD = """
import json, sys
import wavetrain
from wavetrain.data import load_dataset
from wavetrain.pipeline.memory import peak_rss, plan
from wavetrain.models import build
from wavetrain.pipeline.jobs import RunOptions, train_model
from wavetrain.store import FeatureStore
ds = load_dataset(sys.argv[1])
m = build("gmm"); m.label_name_ = "state"
p = plan(ds, m, memory_limit=256 << 20)
opts = RunOptions(store=FeatureStore(sys.argv[2]), batch_windows=p.settings["batch_windows"],
                  cache_bytes=int(p.settings["cache_mb"] * (1 << 20)))
train_model(ds, "state", "gmm", None, opts)
import os
heavy = [m for m in ("torch", "scipy.signal", "sklearn") if m in sys.modules]
env = {k: v for k, v in os.environ.items() if k.startswith(("OMP", "OPENBLAS", "WAVETRAIN", "MKL"))}
print(json.dumps({"predicted": p.predicted_peak_mb, "peak": peak_rss() / (1 << 20),
                  "plan": p.components_mb, "heavy": heavy, "env": env}))
"""


def test_prediction_is_close_to_measured_peak(demo_csv, tmp_path):
    out = subprocess.run([sys.executable, "-c", CHILD, str(demo_csv), str(tmp_path / "store")],
                         capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    assert abs(r["predicted"] - r["peak"]) <= 0.25 * r["peak"], r


def test_a_store_too_small_for_the_features_is_not_planned_as_phases(demo_csv):
    ds = load_dataset(demo_csv)
    roomy = plan(ds, build("gmm"), baseline_rss=50 * MB, store_max_bytes=1 << 30)
    small = plan(ds, build("gmm"), baseline_rss=50 * MB, store_max_bytes=40 << 10)
    none = plan(ds, build("gmm"), baseline_rss=50 * MB, persistent_store=False)
    assert roomy.phased and not small.phased and not none.phased
    assert small.predicted_peak_mb == pytest.approx(none.predicted_peak_mb, abs=0.2)
    assert small.predicted_peak_mb > roomy.predicted_peak_mb


@pytest.mark.parametrize("seconds, cpus, expected", [(1.0, 2, 1), (3.0, 2, 2), (3.0, 1, 1), (None, 2, 1)])
def test_default_workers_follow_recording_length_and_cpus(monkeypatch, seconds, cpus, expected):
    import os

    from wavetrain.stream.scheduler import default_workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert default_workers(seconds) == expected


def test_workers_unset_are_chosen_from_the_data_and_fit_the_limit(demo_csv, tmp_path, monkeypatch):
    """The demo's 1 s recordings get one worker, 4 s ones two; a limit can still take one away;
    the stream of a run without a planner resolves the same rule."""
    import os

    import numpy as np
    import soundfile as sf

    from wavetrain.pipeline.jobs import RunOptions, make_stream

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    short = load_dataset(demo_csv)
    assert plan(short, build("gmm"), workers=None, baseline_rss=50 * MB).settings["workers"] == 1
    rows = []
    for i in range(4):
        sf.write(tmp_path / f"l{i}.wav", np.random.default_rng(i).normal(0, 0.1, 4 * 16000), 16000)
        rows.append(f"l{i}.wav,c={'ab'[i % 2]}\n")
    (tmp_path / "metadata.csv").write_text("".join(rows))
    long = load_dataset(tmp_path / "metadata.csv")
    roomy = plan(long, build("gmm"), workers=None, baseline_rss=50 * MB)
    assert roomy.settings == {**roomy.settings, "workers": 2, "prefetch": 4}
    tight = plan(long, build("gmm"), workers=None, baseline_rss=50 * MB, cache_bytes=0,
                 memory_limit=int((roomy.predicted_peak_mb - roomy.components_mb["memory_cache"]
                                   - roomy.components_mb.get("frame_cache", 0) - 3) * MB))
    assert tight.settings["workers"] == 1
    opts = RunOptions(workers=None, prefetch=None, cache_bytes=0)
    st = make_stream(long, build("gmm"), opts, label="c")
    assert (st.workers, st.prefetch) == (2, 4)
    assert make_stream(short, build("gmm"), opts, label="state").workers == 1   # per data set
    assert opts.workers is None


def test_classify_and_evaluate_with_a_model_file_honour_the_memory_limit(capsys, demo_csv, tmp_path):
    model = str(tmp_path / "m.wt")
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "-o", model,
                 "--cache", str(tmp_path / "c"), "--no-progress"]) == 0
    for cmd in (["classify", "-m", model, str(demo_csv)],
                ["evaluate", "-m", model, "--data", str(demo_csv), "--label", "state"]):
        capsys.readouterr()
        assert main(cmd + ["--memory-limit", "10M", "--cache", str(tmp_path / "c"), "--no-progress"]) == 2
        err = capsys.readouterr()[1]
        assert "would fit with a limit of" in err and len(err.strip().splitlines()) == 1
        assert main(cmd + ["--memory-limit", "2G", "--cache", str(tmp_path / "c"), "--no-progress"]) == 0


@pytest.mark.parametrize("bad", [["--workers", "0"], ["--batch-windows", "0"]])
def test_memory_command_rejects_bad_settings(capsys, demo_csv, bad):
    assert main(["memory", "--data", str(demo_csv), "--model", "gmm", "--label", "state"] + bad) == 2
    assert "expected an integer >= 1, got 0" in capsys.readouterr()[1]


AUGMENT = "copies(n=2) | pad(before=0:300, after=0:300) | noise(snr=10:20)"


def _passes(stream) -> list[int]:
    """Counts the passes over ``stream`` (one entry per pass)."""
    passes: list[int] = []
    inner = stream.batches

    def counted(**kw):
        yield from inner(**kw)
        passes.append(1)

    stream.batches = counted
    return passes


def test_an_augmented_gmm_is_granted_a_frame_cache_that_holds_its_frames(demo_csv, capsys):
    """Augmented EM passes would each decode and augment every recording again: the plan grants
    the GMM what its augmented frames take, and the fit then reads the audio once or twice (the
    first pass counts the frames, a second gathers them), not once per EM pass."""
    from wavetrain.models.base import FitOptions
    from wavetrain.pipeline.jobs import RunOptions, make_stream

    ds = load_dataset(demo_csv)
    model = build("gmm", {"augment": AUGMENT, "components": 2, "max_iter": 8, "tol": 0.0, "accelerate": False})
    model.label_name_ = "state"
    p = plan(ds, model)
    granted = int(p.settings["frame_cache_mb"] * MB)
    assert granted > 0 and p.components_mb["frame_cache"] == pytest.approx(granted / MB, abs=0.1)
    st = make_stream(ds, model, RunOptions(), label="state")
    passes = _passes(st)
    model.fit(st, options=FitOptions(frame_cache_bytes=granted))
    assert len(passes) <= 2 and len(model.history_) >= 8
    # the same fit without the grant goes back to the audio on every EM pass
    again = build("gmm", {"augment": AUGMENT, "components": 2, "max_iter": 8, "tol": 0.0, "accelerate": False})
    st = make_stream(ds, again, RunOptions(), label="state")
    passes = _passes(st)
    again.fit(st, options=FitOptions(frame_cache_bytes=0))
    assert len(passes) > 8
    np.testing.assert_allclose(again.means_, model.means_, rtol=1e-6, atol=1e-8)   # the same EM either way


def test_a_memory_limit_takes_the_frame_cache_back_before_workers_and_batches(demo_csv):
    ds = load_dataset(demo_csv)
    model = build("gmm", {"augment": AUGMENT})
    model.label_name_ = "state"
    free = plan(ds, model, cache_bytes=0)
    limit = int((free.predicted_peak_mb - free.components_mb["frame_cache"] / 2) * MB)
    tight = plan(ds, model, cache_bytes=0, memory_limit=limit)
    assert tight.settings["frame_cache_mb"] == 0 and "frame_cache" not in tight.components_mb
    assert tight.settings["batch_windows"] == free.settings["batch_windows"]
    # without augmentation the GMM gets its frames only within the fixed 64 MB, as before the plan
    plain = build("gmm")
    plain.label_name_ = "state"
    assert 0 < plan(ds, plain).settings["frame_cache_mb"] <= 64


def test_train_with_augmentation_keeps_its_frames_by_default(demo_csv, tmp_path, capsys):
    code = main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", f"augment={AUGMENT}",
                 "--set", "max_iter=3", "-o", str(tmp_path / "m.wt"), "--no-progress", "--cache", str(tmp_path / "c")])
    err = capsys.readouterr()[1]
    assert code == 0 and "frame cache" not in err and "decodes and augments the audio again" not in err, err
