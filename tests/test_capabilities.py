"""What a family can do is data on its class (capability tags), never a list of names in the
engines or the command line."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import tone
from wavetrain.cli.main import main
from wavetrain.core.errors import ParameterError
from wavetrain.models.base import LEARNS_BY, TAGS, Classifier
from wavetrain.models.registry import DEFAULT_MODEL, PRESETS, build, families_with, family, family_names
from wavetrain.spark.support import spark_support


def _families() -> list[type[Classifier]]:
    return [family(n) for n in family_names()]


@pytest.mark.parametrize("name", family_names())
def test_every_family_declares_valid_tags(name):
    cls = family(name)
    tags = cls.tags()
    assert set(tags) == set(TAGS)
    assert tags["learns_by"] in LEARNS_BY, f"{name}: learns_by {tags['learns_by']!r}"
    for t in TAGS[1:]:
        assert isinstance(tags[t], bool), f"{name}.{t} is not a bool"


@pytest.mark.parametrize("name", family_names())
def test_tags_are_consistent(name):
    cls = family(name)
    if cls.supports_distributed or cls.mixes_batches:
        assert cls.learns_by == "sgd", f"{name}: distributed ranks and mixup are for gradient-step training"
    if cls.supports_device_groups:
        # gradient steps split over the devices, or an E-step whose blocks of frames they share
        assert cls.learns_by == "sgd" or (cls.learns_by == "statistics" and callable(getattr(cls, "pass_stats", None)))
    if cls.detector:
        assert cls.min_labels == 1 and cls.score_kind == "anomaly"
    else:
        assert cls.score_kind != "anomaly"


def test_tags_name_the_ways_of_learning():
    by = {n: family(n).learns_by for n in family_names()}
    assert {v for v in by.values()} == set(LEARNS_BY)
    # the ways of learning the engines must handle, each by at least one classifier and one detector
    # where the project has both
    assert any(family(n).detector for n, v in by.items() if v == "statistics")
    assert any(family(n).detector for n, v in by.items() if v == "sgd")
    assert any(not family(n).detector for n, v in by.items() if v == "sgd")


def test_default_model_is_registered():
    assert DEFAULT_MODEL in family_names() or DEFAULT_MODEL in PRESETS


@pytest.mark.parametrize("name", [family_names()[0], next(iter(PRESETS))])
def test_models_command_shows_tags(name, capsys):
    assert main(["models", name, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0]["tags"] == family(out[0]["family"]).tags()
    assert main(["models", name]) == 0
    text = capsys.readouterr().out
    assert f"learns by {family(out[0]['family']).learns_by};" in text


# -- no family name in the engines or the command line -------------------------------------------
SRC = Path(__file__).resolve().parents[1] / "src" / "wavetrain"
#: Code that must decide from tags: the command line, the engines (Spark, local), the stream, serving.
ENGINE_CODE = [*sorted(p for d in ("cli", "spark", "pipeline", "stream", "serve") for p in (SRC / d).glob("*.py"))]


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def names_in_literals(source: str, names: list[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of every family name that is a word of a string literal (docstrings and
    comments aside) of ``source``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    pattern = re.compile(r"(?<![\w-])(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                         + r")(?![\w-])")
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            hits += [(node.lineno, m.group(1)) for m in pattern.finditer(node.value)]
    return hits


def test_the_name_check_finds_names():
    src = 'def f():\n    """gmm in a docstring"""\n    # cnn in a comment\n    return ("gmm", f"{x} rescnn,", "gmms")\n'
    assert names_in_literals(src, ["gmm", "cnn", "rescnn"]) == [(4, "gmm"), (4, "rescnn")]


@pytest.mark.parametrize("path", ENGINE_CODE, ids=lambda p: str(p.relative_to(SRC)))
def test_no_family_name_in_engine_or_cli_code(path):
    names = family_names() + list(PRESETS)
    hits = names_in_literals(path.read_text(encoding="utf-8"), names)
    assert not hits, f"{path.name}: family names in string literals (decide from the tags): {hits}"


# -- what Spark trains, from the tags ------------------------------------------------------------
@pytest.mark.parametrize("name", family_names())
def test_spark_support_follows_the_tags(name):
    cls = family(name)
    reason = spark_support(cls)
    ranks = cls.learns_by == "sgd" and cls.supports_distributed
    passes = cls.learns_by == "statistics" and cls.any_executor   # fit written against an executor
    members = cls.learns_by == "members"          # as its members (each a family of its own)
    assert not ranks or cls.any_executor
    if ranks or passes or members:
        assert reason is None
    else:
        assert reason is not None
    if reason is not None:
        assert reason.startswith(f"{name}: ") and reason.endswith("--engine local") and "\n" not in reason
    assert spark_support(cls()) == reason       # an instance answers as its class


def test_every_family_trains_on_spark_by_one_of_the_three_paths():
    supported = [n for n in family_names() if spark_support(family(n)) is None]
    assert supported == family_names()
    assert {family(n).learns_by for n in supported} == {"statistics", "sgd", "members"}


def test_a_family_whose_tags_say_it_cannot_train_on_spark_is_refused():
    solo = type("Solo", (family("cnn"),), {"name": "solo", "supports_distributed": False})
    reason = spark_support(solo)
    assert reason.startswith("solo: the Spark engine trains gradient-step models as distributed ranks")
    assert reason.endswith("train solo with --engine local")


def test_spark_support_does_not_import_pyspark():
    code = "import sys, wavetrain.spark.support; assert 'pyspark' not in sys.modules, 'pyspark imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- messages listing families are derived from the tags -----------------------------------------
def test_device_group_refusal_lists_families_from_tags(tmp_path, capsys):
    one_device = next(n for n in family_names() if not family(n).supports_device_groups)
    rc = main(["train", "--data", str(tmp_path), "--label", "word", "--model", one_device, "--devices", "cpu,cpu",
               "-o", str(tmp_path / "m.wt")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert err.endswith(", ".join(families_with(supports_device_groups=True)))


def test_mixup_refusal_lists_families_from_tags(tmp_path):
    import soundfile as sf

    from wavetrain.data import load_dataset
    from wavetrain.pipeline.jobs import RunOptions, make_stream

    no_mixup = next(n for n in family_names() if not family(n).mixes_batches and not family(n).detector)
    model = build(no_mixup, {"augment": "mixup(alpha=0.2)"})
    wav = tmp_path / "tone.wav"
    sf.write(wav, tone(), 16000)                 # data the test makes: no ../shared needed
    ds = load_dataset([str(wav)])
    with pytest.raises(ParameterError, match="mixup") as e:
        make_stream(ds, model, RunOptions(), label=None)
    assert f"({', '.join(families_with(mixes_batches=True))})" in str(e.value)


# -- refused before the JVM ----------------------------------------------------------------------
SPARK = ("--engine", "spark", "--master", "local[2]")


@pytest.fixture
def no_jvm(monkeypatch):
    """Starting Spark is recorded and fails: every case here must be refused before it."""
    import wavetrain.spark.session as session

    started = []

    def refuse(settings):
        started.append(settings)
        raise AssertionError("Spark was started for a run that could be refused without it")

    monkeypatch.setattr(session, "spark_session", refuse)
    return started


def _refused(capsys, started, argv, message):
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert not started, f"Spark started before refusing {argv}"
    assert rc == 2 and message in err and "\n" not in err, err


def test_train_on_spark_refuses_a_family_before_the_jvm_from_its_tags(demo_csv, tmp_path, capsys, no_jvm,
                                                                      monkeypatch):
    monkeypatch.setattr(family("cnn"), "supports_distributed", False)
    reason = spark_support(family("cnn"))
    assert reason.startswith("cnn: ")
    _refused(capsys, no_jvm, ["train", "--data", demo_csv, "--label", "state", "-o", tmp_path / "m.wt", *SPARK,
                              "--model", "cnn"], reason)
    _refused(capsys, no_jvm, ["evaluate", "--data", demo_csv, "--label", "state", *SPARK, "--model", "cnn"], reason)
    _refused(capsys, no_jvm, ["train", "--data", demo_csv, "--label", "state", "-o", tmp_path / "m.wt", *SPARK,
                              "--model", "ensemble", "--set", "members=gmm,cnn"], f"ensemble: member 2: {reason}")


@pytest.mark.parametrize("extra, message", [
    (("--model", "gmm", "--set", "augment=mixup(alpha=0.2)"), "gmm: mixup mixes the mini-batches"),
    (("--model", "gmm", "--set", "components=0"), "components"),
    (("--model", "gmm", "--checkpoint", "{tmp}/ck"), "is fitted without checkpoints"),
    (("--model", "gmm", "--processes", "2"), "--processes sets the ranks of distributed training"),
    (("--model", "gmm", "--normal", "healthy"), "--normal applies to anomaly detectors"),
    (("--model", "gmm", "--label", "colour"), "no label named 'colour'"),
    (("--model", "gmm", "--group-by", "colour"), "no label named 'colour'"),
    (("--model", "gmm", "--where", "state=healthy"), "needs at least 2 label values, got 1 (healthy)"),
    (("--model", "gmm", "--label", None), "give --label NAME"),
    (("--model", "gmm", "--spark-conf", "spark.executorEnv.WAVETRAIN_SPARK_GRAM_CACHE=lots"),
     "WAVETRAIN_SPARK_GRAM_CACHE='lots': expected a size"),
])
def test_train_on_spark_refuses_before_the_jvm(demo_csv, tmp_path, capsys, no_jvm, extra, message):
    argv = ["train", "--data", demo_csv, "--label", "state", "-o", tmp_path / "m.wt", *SPARK]
    extra = [str(a).replace("{tmp}", str(tmp_path)) if a is not None else None for a in extra]
    if "--label" in extra:                    # replaces the default label (None: no --label at all)
        i = argv.index("--label")
        del argv[i:i + 2]
        j = extra.index("--label")
        extra = extra[:j] + (extra[j:j + 2] if extra[j + 1] is not None else []) + extra[j + 2:]
    _refused(capsys, no_jvm, [*argv, *extra], message)
    assert not (tmp_path / "m.wt").exists()


@pytest.mark.parametrize("extra, message", [
    (("--model", "anomaly-gmm", "--set", "augment=mixup(alpha=0.2)"), "anomaly-gmm: mixup mixes the mini-batches"),
    (("--model", "gmm", "--group-by", "colour"), "no label named 'colour'"),
    (("--model", "gmm", "--normal", "healthy"), "--normal applies to anomaly detectors"),
])
def test_cross_validation_on_spark_refuses_before_the_jvm(demo_csv, capsys, no_jvm, extra, message):
    _refused(capsys, no_jvm, ["evaluate", "--data", demo_csv, "--label", "state", *SPARK, *extra], message)


def test_evaluating_a_model_file_on_spark_checks_the_data_before_the_jvm(demo_csv, tmp_path, capsys, no_jvm):
    model = tmp_path / "m.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=2",
                 "-o", str(model)]) == 0
    capsys.readouterr()
    _refused(capsys, no_jvm, ["evaluate", "-m", model, "--data", demo_csv, "--label", "colour", *SPARK],
             "no label named 'colour'")
    _refused(capsys, no_jvm, ["evaluate", "-m", model, "--data", demo_csv, "--label", "state", "--group-by",
                              "colour", *SPARK], "no label named 'colour'")


def test_memory_plan_on_spark_refuses_what_spark_cannot_train(demo_csv, capsys, no_jvm):
    _refused(capsys, no_jvm, ["memory", "--data", demo_csv, "--label", "state", "--model", "gmm", "--set",
                              "augment=mixup(alpha=0.2)", "--engine", "spark"], "mixup mixes the mini-batches")
    assert main(["memory", "--data", str(demo_csv), "--label", "state", "--model", "ensemble", "--engine",
                 "spark"]) == 0 and not no_jvm


def test_features_on_spark_refuses_a_bad_spec_before_the_jvm(demo_csv, tmp_path, capsys, no_jvm):
    _refused(capsys, no_jvm, ["features", "--data", demo_csv, "--spec", "logmel(bands=0)", "-o", tmp_path / "t",
                              *SPARK], "bands")


def test_augmentation_is_no_reason_to_refuse_spark():
    """The executors augment as the local stream does (tests/spark/test_augment_on_spark.py)."""
    assert spark_support(build(DEFAULT_MODEL, {"augment": "room"})) is None
