"""``wavetrain evaluate -m DETECTOR --by [MACHINE,]SECTION,DOMAIN`` and ``plot roc --by``: the DCASE
figures per machine type, section and domain and the official score, equal to
:func:`~wavetrain.evaluation.dcase_scores.dcase_report` of the detector's window scores averaged
per recording by hand; the refusals in one line; the plot's panels and curves."""
import json
from collections import defaultdict

import numpy as np
import pytest

from wavetrain.cli.main import main
from wavetrain.data import load_dataset
from wavetrain.data.audio import write_audio
from wavetrain.data.demo import machine_sound
from wavetrain.data.metadata import write_metadata
from wavetrain.data.recording import Recording
from wavetrain.evaluation import detection_plot
from wavetrain.evaluation.dcase_scores import dcase_report
from wavetrain.models.modelfile import load_model
from wavetrain.pipeline.jobs import RunOptions, window_predictions

RATE = 16000
#: Each machine type's shaft rate per section (Hz); the target domain runs 25 % faster, noisier.
SHAFT = {"fan": {"s00": 20.0, "s01": 27.0}, "pump": {"s00": 34.0, "s01": 41.0}}
FAULTS = ("bearing", "loose")


def _write_fleet(folder, rng):
    """Per machine type and section: 4 normal source and 1 normal target training clips; per
    domain 3 normal and 3 anomalous test clips (labels machine, section, domain, state, split,
    and rig with three values)."""
    recs = []

    def clip(machine, section, domain, state, split, i):
        shaft = SHAFT[machine][section] * (1.25 if domain == "target" else 1.0) * rng.uniform(0.97, 1.03)
        x = machine_sound(state, rate=RATE, seconds=0.75, shaft_hz=shaft,
                          snr_db=18.0 if domain == "source" else 10.0, rng=rng)
        path = folder / f"{machine}_{section}_{domain}_{split}_{state}_{i}.wav"
        write_audio(path, x, RATE)
        labels = {"machine": machine, "section": section, "domain": domain,
                  "state": "normal" if state == "healthy" else "anomaly", "split": split,
                  "rig": "abc"[i % 3]}
        recs.append(Recording(path, labels))

    for machine in SHAFT:
        for section in SHAFT[machine]:
            for i in range(4):
                clip(machine, section, "source", "healthy", "train", i)
            clip(machine, section, "target", "healthy", "train", 0)
            for domain in ("source", "target"):
                for i in range(3):
                    clip(machine, section, domain, "healthy", "test", i)
                    clip(machine, section, domain, FAULTS[i % 2], "test", i)
    write_metadata(folder / "metadata.csv", recs)
    # the same clips, less the anomalies of fan s01: a section without anomalous recordings
    write_metadata(folder / "no_fan_s01_anomalies.csv",
                   [r for r in recs if not (r.labels["machine"] == "fan" and r.labels["section"] == "s01"
                                            and r.labels["state"] == "anomaly")])
    return folder / "metadata.csv"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    return _write_fleet(tmp_path_factory.mktemp("fleet"), np.random.default_rng(7))


@pytest.fixture(scope="module")
def detector(fleet, tmp_path_factory):
    path = tmp_path_factory.mktemp("det") / "fleet.wt"
    assert main(["train", "--data", str(fleet), "--where", "split=train", "--label", "state", "--model",
                 "normal-dist", "--clip-ms", "250", "-o", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def classifier(fleet, tmp_path_factory):
    path = tmp_path_factory.mktemp("cls") / "gmm.wt"
    assert main(["train", "--data", str(fleet), "--where", "split=test", "--label", "state", "--model", "gmm",
                 "--set", "components=1", "--set", "max_iter=3", "--clip-ms", "250", "-o", str(path)]) == 0
    return path


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def _refused(capsys, *argv) -> str:
    """The one-line message of a refused command (exit 2)."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _by_hand(detector, csv, *where):
    """The DCASE report of the detector's window scores averaged per recording, by hand."""
    ds = load_dataset([csv], where=[("split", ("test",)), *where])
    model = load_model(detector)
    per = defaultdict(list)
    for p in window_predictions(model, ds, RunOptions())[0]:
        per[p.recording.name].append(float(p.scores[0]))
    y = [int(r.labels["state"] != "normal") for r in ds]
    scores = [np.mean(per[r.name]) for r in ds]

    def col(name):
        return [r.labels[name] for r in ds]

    return dcase_report(y, scores, col("section"), col("domain"), machine=col("machine")), scores


def test_the_json_figures_are_the_dcase_report_of_the_recordings_mean_window_scores(capsys, fleet, detector):
    out, _ = _run(capsys, "evaluate", "-m", detector, "--data", fleet, "--where", "split=test", "--label", "state",
                  "--by", "--json")
    res = json.loads(out)
    dcase = res["sections"]
    expected, scores = _by_hand(detector, fleet)
    assert len(set(np.round(scores, 9))) == len(scores)           # (the scores are not all one value)
    assert dcase["domains"] == ["source", "target"] and dcase["machine_label"] == "machine"
    assert (dcase["section_label"], dcase["domain_label"]) == ("section", "domain")
    assert [(g["machine"], g["section"]) for g in dcase["groups"]] == [
        ("fan", "s00"), ("fan", "s01"), ("pump", "s00"), ("pump", "s01")]
    for got, want in zip(dcase["groups"], expected["groups"]):
        assert got["normal"] == want["normal"] == {"source": 3, "target": 3}
        assert got["anomalous"] == want["anomalous"] == {"source": 3, "target": 3}
        assert got["auc"] == pytest.approx(want["auc"]) and got["pauc"] == pytest.approx(want["pauc"])
    assert dcase["official_score"] == pytest.approx(expected["official_score"])
    assert set(dcase["machines"]) == {"fan", "pump"}
    for name, want in expected["machines"].items():
        got = dcase["machines"][name]
        assert got["auc"] == pytest.approx(want["auc"])
        assert (got["pauc"], got["score"]) == pytest.approx((want["pauc"], want["score"]))
    assert dcase["figures"] == 12 and dcase["left_out"] == [] and dcase["recordings"] == 48
    # the AUCs differ from group to group (the detector is not trivially perfect or constant)
    assert len({g["auc"]["target"] for g in dcase["groups"]} | {g["auc"]["source"] for g in dcase["groups"]}) > 1
    # the pooled window figures are those of evaluate without --by
    plain, _ = _run(capsys, "evaluate", "-m", detector, "--data", fleet, "--where", "split=test", "--label", "state",
                    "--json")
    plain = json.loads(plain)
    assert "sections" not in plain
    for key in ("auc", "pauc", "windows", "normal", "anomalous", "precision", "recall", "recordings"):
        assert res[key] == pytest.approx(plain[key])


def test_the_text_table_per_machine_and_section_ends_with_the_official_score(capsys, fleet, detector):
    out, _ = _run(capsys, "evaluate", "-m", detector, "--data", fleet, "--where", "split=test", "--label", "state",
                  "--by", "section,domain")
    expected, _ = _by_hand(detector, fleet)
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("scores per section and domain"))
    assert lines[at + 1].split()[:6] == ["machine", "section", "AUC", "source", "AUC", "target"]
    rows = [line.split() for line in lines[at + 2:at + 6]]
    for row, g in zip(rows, expected["groups"]):
        assert row[:2] == [g["machine"], g["section"]]
        assert [float(v) for v in row[2:5]] == pytest.approx(
            [g["auc"]["source"], g["auc"]["target"], g["pauc"]], abs=5e-5)
        assert row[5:] == ["3/3", "3/3"]
    assert [line.split()[:3] for line in lines[at + 6:at + 8]] == [["fan", "harmonic", "mean"],
                                                                    ["pump", "harmonic", "mean"]]
    last = lines[-1]
    assert last.startswith("official score ")
    assert float(last.split()[2]) == pytest.approx(expected["official_score"], abs=5e-5)
    assert "of 12 figures" in last and "of 4 sections" in last


def test_one_machine_type_has_no_machine_column_and_three_names_pick_the_type_label(capsys, fleet, detector):
    out, _ = _run(capsys, "evaluate", "-m", detector, "--data", fleet, "--where", "split=test", "--where",
                  "machine=pump", "--label", "state", "--by", "--json")
    dcase = json.loads(out)["sections"]
    assert dcase["machine_label"] is None and "machines" not in dcase
    assert [(g["machine"], g["section"]) for g in dcase["groups"]] == [(None, "s00"), (None, "s01")]
    expected, _ = _by_hand(detector, fleet, ("machine", ("pump",)))
    assert dcase["official_score"] == pytest.approx(expected["official_score"])
    out, _ = _run(capsys, "evaluate", "-m", detector, "--data", fleet, "--where", "split=test", "--where",
                  "machine=pump", "--label", "state", "--by")
    header = next(line for line in out.splitlines() if line.startswith("section"))
    assert "machine" not in header
    # three names: the first is the machine type's label, even with one value
    out, _ = _run(capsys, "evaluate", "-m", detector, "--data", fleet, "--where", "split=test", "--where",
                  "machine=pump", "--label", "state", "--by", "machine,section,domain", "--json")
    assert [g["machine"] for g in json.loads(out)["sections"]["groups"]] == ["pump", "pump"]


def test_a_section_without_anomalies_is_na_and_left_out_once(capsys, fleet, detector):
    data = fleet.parent / "no_fan_s01_anomalies.csv"
    out, _ = _run(capsys, "evaluate", "-m", detector, "--data", data, "--where", "split=test", "--label", "state",
                  "--by")
    lines = out.splitlines()
    fan_s01 = next(line for line in lines if line.startswith("fan") and " s01 " in line)
    assert fan_s01.split()[2:5] == ["n/a", "n/a", "n/a"]
    notes = [line for line in lines if line.startswith("note: n/a")]
    assert len(notes) == 1 and "fan s01: AUC source; fan s01: AUC target; fan s01: pAUC" in notes[0]
    out, _ = _run(capsys, "evaluate", "-m", detector, "--data", data, "--where", "split=test", "--label", "state",
                  "--by", "--json")
    dcase = json.loads(out)["sections"]
    full, _ = _by_hand(detector, fleet)
    kept = [g for g in full["groups"] if (g["machine"], g["section"]) != ("fan", "s01")]
    assert dcase["figures"] == 9
    assert dcase["official_score"] == pytest.approx(
        9 / sum(1 / v for g in kept for v in (g["auc"]["source"], g["auc"]["target"], g["pauc"])))


def test_refusals_are_one_line(capsys, fleet, detector, classifier):
    test = ("--data", fleet, "--where", "split=test", "--label", "state")
    err = _refused(capsys, "evaluate", "-m", classifier, *test, "--by")
    assert "--by reports an anomaly detector's scores" in err and "gmm classifier" in err
    err = _refused(capsys, "evaluate", "--model", "normal-dist", *test, "--by")
    assert "--by scores a trained anomaly detector" in err and "-m MODEL.wt" in err
    err = _refused(capsys, "evaluate", "-m", detector, *test, "--by", "sect,domain")
    assert "--by: no label named 'sect'" in err and "section" in err
    err = _refused(capsys, "evaluate", "-m", detector, *test, "--by", "section,rig")
    assert "the domain label 'rig' has 3 values (a, b, c)" in err
    err = _refused(capsys, "evaluate", "-m", detector, *test, "--where", "domain=target", "--by")
    assert "the domain label 'domain' has 1 value (target)" in err
    err = _refused(capsys, "evaluate", "-m", detector, *test, "--by", "section")
    assert "expected two or three different label names" in err
    err = _refused(capsys, "evaluate", "-m", detector, *test, "--by", "--events")
    assert "--by does not apply to --events" in err
    err = _refused(capsys, "plot", "roc", "-m", detector, *test, "--by", "section,rig", "-o",
                   fleet.parent / "r.png")
    assert "the domain label 'rig' has 3 values" in err
    assert not (fleet.parent / "r.png").exists()


@pytest.fixture
def figures(monkeypatch):
    """The ROC figures per section built, with what they were given."""
    seen = []
    build = detection_plot.build_section_roc_figure

    def spy(*args, **kw):
        fig = build(*args, **kw)
        seen.append({"fig": fig, "args": args, **kw})
        return fig

    monkeypatch.setattr(detection_plot, "build_section_roc_figure", spy)
    return seen


def test_plot_roc_by_draws_each_domain_per_section_with_its_auc(capsys, fleet, detector, tmp_path, figures):
    out = tmp_path / "roc.png"
    _, err = _run(capsys, "plot", "roc", "-m", detector, "--data", fleet, "--where", "split=test", "--label",
                  "state", "--by", "-o", out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    expected, _ = _by_hand(detector, fleet)
    assert f"official score {expected['official_score']:.4f}" in err
    (seen,) = figures
    panels = [ax for ax in seen["fig"].axes if ax.get_visible()]
    assert len(panels) == 4
    for ax, g in zip(panels, expected["groups"]):
        assert ax.get_title() == f"{g['machine']} {g['section']} \u2014 pAUC {g['pauc']:.3f}"
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == [f"source: AUC {g['auc']['source']:.3f}", f"target: AUC {g['auc']['target']:.3f}"]
        # each curve's area is its AUC
        curves = [line for line in ax.get_lines() if line.get_label().startswith(("source", "target"))]
        areas = [np.trapezoid(line.get_ydata(), line.get_xdata()) for line in curves]
        assert areas == pytest.approx([g["auc"]["source"], g["auc"]["target"]])
