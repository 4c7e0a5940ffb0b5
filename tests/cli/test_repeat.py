"""``wavetrain evaluate --repeat N``: k-fold cross-validation repeated with seeds seed, seed+1, ...
(folds and the model's seed), mean ± sd over the repeats; --repeat 1 is the plain cross-validation."""
import json

import pytest

from wavetrain.cli.main import main

GMM = ("--model", "gmm", "--set", "components=2", "--set", "max_iter=10")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _kfold(capsys, demo_csv, *extra):
    code, out, err = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", *GMM, "--folds", "2",
                         "--no-cache", *extra)
    assert code == 0, err
    return out, err


def test_repeat_json(capsys, demo_csv):
    one, _ = _kfold(capsys, demo_csv, "--json")
    three, _ = _kfold(capsys, demo_csv, "--json", "--repeat", "3")
    one, three = json.loads(one), json.loads(three)
    assert "repeats" not in one and "repeat_summary" not in one
    reps = three["repeats"]
    assert [r["repeat"] for r in reps] == [1, 2, 3]
    assert [r["seed"] for r in reps] == [0, 1, 2] and [r["model_seed"] for r in reps] == [0, 1, 2]
    # the first repeat is the plain cross-validation, and the top level is its report
    assert reps[0]["accuracy"] == one["accuracy"] and reps[0]["macro_f1"] == one["macro_f1"]
    assert three["confusion"] == one["confusion"] and len(three["folds"]) == 2
    summary = three["repeat_summary"]
    assert set(summary) == {"accuracy", "macro_f1"}
    accs = [r["accuracy"] for r in reps]
    assert summary["accuracy"]["mean"] == pytest.approx(sum(accs) / 3)
    mean = sum(accs) / 3
    assert summary["accuracy"]["sd"] == pytest.approx((sum((a - mean) ** 2 for a in accs) / 2) ** 0.5)
    assert all(0 <= r["macro_f1"] <= 1 and "folds_summary" in r for r in reps)


def test_repeat_1_output_is_unchanged(capsys, demo_csv):
    plain, err_plain = _kfold(capsys, demo_csv)
    once, err_once = _kfold(capsys, demo_csv, "--repeat", "1")
    assert plain == once and "repeat" not in once
    assert "repeat" not in err_once and err_once.count("fold ") == 2


def test_repeat_text_report(capsys, demo_csv):
    out, err = _kfold(capsys, demo_csv, "--repeat", "2", "--seed", "5")
    assert "repeat 1 (seed 5, model seed 0): accuracy" in out
    assert "repeat 2 (seed 6, model seed 1): accuracy" in out
    assert "over 2 repeats: accuracy " in out and "macro-F1 " in out and " ± " in out
    assert "repeat 2/2 fold 2/2:" in err


def test_repeat_text_leads_with_the_summary(capsys, demo_csv):
    """The figures over every repeat come first, then each repeat's, then the first repeat in full
    (whose accuracy line would otherwise read as the result)."""
    out, _ = _kfold(capsys, demo_csv, "--repeat", "3", "--group-by", "machine")
    lines = out.splitlines()
    assert lines[0].startswith("over 3 repeats: accuracy ") and " ± " in lines[0]
    assert [line.split(" (")[0] for line in lines[1:4]] == ["repeat 1", "repeat 2", "repeat 3"]
    assert lines[4] == "repeat 1 of 3 in detail:" and lines[5].startswith("accuracy ")
    assert "per machine, weakest first:" in lines[6:]
    assert sum(line.startswith("over ") for line in lines) == 1


def test_repeat_detector(capsys, demo_csv):
    code, out, err = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", "--normal", "healthy",
                         "--model", "normal-dist", "--folds", "2", "--repeat", "2", "--no-cache", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert set(res["repeat_summary"]) == {"auc", "pauc"}
    assert [r["seed"] for r in res["repeats"]] == [0, 1]
    assert all(0 <= r["auc"] <= 1 and 0 <= r["pauc"] <= 1 for r in res["repeats"])
    code, out, _ = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", "--normal", "healthy",
                       "--model", "normal-dist", "--folds", "2", "--repeat", "2", "--no-cache")
    assert code == 0 and "over 2 repeats: AUC " in out and "pAUC " in out


@pytest.mark.parametrize("extra, message", [
    (("--repeat", "0"), "--repeat: expected an integer >= 1"),
])
def test_bad_repeat_is_one_line(capsys, demo_csv, extra, message):
    code, _, err = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", *GMM, *extra)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_repeat_with_a_model_file_is_refused(capsys, demo_csv, tmp_path):
    path = tmp_path / "m.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", *GMM, "-o", str(path)]) == 0
    capsys.readouterr()
    code, _, err = run(capsys, "evaluate", "-m", path, "--data", demo_csv, "--label", "state", "--repeat", "2")
    assert code == 2 and "a trained model (-m) is evaluated once" in err and len(err.strip().splitlines()) == 1
