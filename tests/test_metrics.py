import numpy as np
import pytest

from wavetrain.evaluation.metrics import confusion, macro_f1, scores, topk_accuracy


def test_metrics_against_sklearn():
    from sklearn.metrics import accuracy_score, f1_score, precision_recall_fscore_support

    rng = np.random.default_rng(0)
    labels = ["a", "b", "c"]
    y = rng.choice(labels, 200).tolist()
    p = [t if rng.random() < 0.7 else rng.choice(labels) for t in y]
    s = scores(confusion(y, p, labels), labels)
    assert s["accuracy"] == pytest.approx(accuracy_score(y, p))
    assert s["macro_f1"] == pytest.approx(f1_score(y, p, average="macro"))
    pr, rc, f1, sup = precision_recall_fscore_support(y, p, labels=labels)
    for i, v in enumerate(labels):
        assert s["per_value"][v]["precision"] == pytest.approx(pr[i])
        assert s["per_value"][v]["recall"] == pytest.approx(rc[i])
    assert s["micro"]["f1"] == pytest.approx(f1_score(y, p, average="micro"))


def test_unknown_predictions_counted_as_errors():
    cm = confusion(["a", "b"], ["unknown", "b"], ["a", "b"])
    assert cm.tolist() == [[0, 0, 1], [0, 1, 0]]
    assert scores(cm, ["a", "b"])["accuracy"] == 0.5


def test_one_macro_f1_everywhere():
    """Training validation and evaluate average F1 over the same classes: those with support."""
    from sklearn.metrics import f1_score

    y = np.array([0, 0, 1, 1, 1, 2])
    p = np.array([0, 3, 1, 1, 0, 2])          # class 3 is predicted but never true
    labels = ["a", "b", "c", "d"]
    s = scores(confusion([labels[i] for i in y], [labels[i] for i in p], labels), labels)
    assert macro_f1(y, p) == pytest.approx(s["macro_f1"])
    assert macro_f1(y, p) == pytest.approx(f1_score(y, p, labels=[0, 1, 2], average="macro"))


def test_topk_accuracy():
    proba = np.array([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7]])
    assert topk_accuracy(proba, np.array([1, 1]), 1) == 0.0
    assert topk_accuracy(proba, np.array([1, 1]), 2) == 1.0


@pytest.mark.parametrize("labels", [["a", "b"], ["healthy", "bearing"], ["a-much-longer-value", "b"]])
def test_the_report_rows_line_up(labels):
    from wavetrain.evaluation.metrics import format_report, report

    y_true = [labels[0]] * 3 + [labels[1]] * 2
    y_pred = [labels[0], labels[1], labels[0], labels[1], labels[1]]
    lines = format_report(report(y_true, y_pred, labels)).splitlines()
    rows = [line for line in lines if line.split()[0] in labels or " mean" in line]
    assert len(rows) == 4
    # every row's precision figure ends where the header's "precision" ends
    head = next(line for line in lines if line.startswith("value"))
    end = head.index("precision") + len("precision")
    assert all(row[end - 6:end].strip().replace(".", "").isdigit() and row[end:end + 2] == "  " for row in rows), lines
