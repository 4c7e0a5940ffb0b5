"""Distributed-data-parallel training of a cnn on Spark (``TorchDistributor``, two gloo ranks on
the local[2] session of conftest.py): it learns, a rank that dies mid-training makes the driver run
the stage again, every rank resuming from rank 0's checkpoint, and what cannot work fails at once
with a one-line error.

About 100 s on the reference machine (2 vCPUs; a stage costs ~20 s of process starts: pandas and
pyarrow in the task, torch in torchrun and in the rank): the session and the features ~15 s, a
training stage ~25 s, the killed one ~50 s (a failed stage, then a resumed one). The slow-marked
user-error test adds ~20 s.
"""
from __future__ import annotations

import logging
import os
import sys

import numpy as np
import pytest

from wavetrain.core.errors import UserError
from wavetrain.data import load_dataset, write_audio
from wavetrain.models import build
from wavetrain.spark.extract import extract_missing
from wavetrain.spark.neural import fit_neural, summary
from wavetrain.spark.shards import part_tasks, part_windows
from wavetrain.spark.table import FeatureTable
from wavetrain.stream.source import FeatureSource
from wavetrain.stream.windows import Windowing
from wavetrain.train.callbacks import Callback

RATE = 16000
PER_CLASS = 24                      # 0.5 s files: 16 train, 4 valid, 4 test per class
PARAMS = dict(features="logmel(bands=16)", clip_ms=100, epochs=3, batch_size=8, lr=0.003, seed=1)


def _write_data(root) -> None:
    rng = np.random.default_rng(0)
    t = np.arange(RATE // 2) / RATE
    for name in ("tone", "noise"):
        (root / name).mkdir(parents=True)
    for i in range(PER_CLASS):
        write_audio(root / "tone" / f"t{i:02d}.wav", 0.5 * np.sin(2 * np.pi * rng.uniform(300, 3000) * t), RATE)
        write_audio(root / "noise" / f"n{i:02d}.wav", 0.3 * rng.standard_normal(t.size).clip(-3, 3) / 3, RATE)


@pytest.fixture(scope="module")
def data(spark, tmp_path_factory):
    """The feature table of the data set, and its tasks: train, valid and test."""
    root = tmp_path_factory.mktemp("neural")
    _write_data(root / "audio")
    ds = load_dataset(root / "audio")
    labels = sorted(set(ds.values("class")))
    source = FeatureSource(PARAMS["features"])
    table = FeatureTable(str(root / "table"))
    assert not extract_missing(spark, table, ds, source).bad
    keys = [source.spec_for(rec)[1] for rec in ds]
    catalog = table.catalog(keys)
    index = np.arange(len(ds)) % 6                       # 4 of 6 train, 1 valid, 1 test

    def tasks(keep):
        sub = [i for i in range(len(ds)) if keep(index[i])]
        ys = [labels.index(ds[i].labels["class"]) for i in sub]
        found, missing = part_tasks(catalog, ds.subset(sub), [keys[i] for i in sub], ys)
        assert not missing
        return found

    dim = table.feature_dim(next(iter(catalog.values())))
    return {"table": table, "labels": labels, "dim": dim, "train": tasks(lambda k: k < 4),
            "valid": tasks(lambda k: k == 4), "test": tasks(lambda k: k == 5)}


def _fit(spark, data, **kw):
    model = build("cnn", PARAMS)
    return fit_neural(spark, model, data["table"], data["train"], data["valid"], labels=data["labels"],
                      feature_dim=data["dim"], rate=None, channels=None, num_processes=2, **kw)


def _test_accuracy(model, data) -> float:
    windows = [(w, y) for task in data["test"]
               for w, y, _, _ in part_windows(data["table"], task, model.feature_spec,
                                              Windowing.from_params(model.params))]
    predicted = model.predict([w for w, _ in windows])
    return float(np.mean([p == data["labels"][y] for p, (_, y) in zip(predicted, windows)]))


class DieOnce(Callback):
    """Rank 1 exits (as a killed process would) at its first step of the second epoch, once: the
    marker file says it did. Every rank notes the iteration of its first step in ``starts``."""

    def __init__(self, marker: str, starts: str):
        self.marker, self.starts, self.started = marker, starts, False

    def on_step(self, loop, loss: float, n: int) -> None:
        import torch.distributed as dist

        if not self.started:
            self.started = True
            with open(self.starts, "a") as f:
                f.write(f"{dist.get_rank()} {loop.iteration}\n")
        if dist.get_rank() == 1 and loop.epoch >= 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)


def test_ddp_training_learns_and_leaves_no_checkpoint(spark, data):
    model = _fit(spark, data)
    assert model.train_info_["processes"] == 2 and model.train_info_["attempts"] == 1
    assert [h["epoch"] for h in model.history_] == [1.0, 2.0, 3.0]
    assert all(h["top1"] is not None for h in model.history_)
    assert _test_accuracy(model, data) >= 0.8
    scratch = data["table"].root + "/_scratch"
    assert not os.path.isdir(scratch) or not os.listdir(scratch), "the temporary checkpoint folder is left"


def test_a_dead_rank_is_retried_from_the_checkpoint(spark, data, tmp_path, caplog):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])     # executors cannot import this module
    marker, starts, ck = tmp_path / "died", tmp_path / "starts", tmp_path / "ck"
    with caplog.at_level(logging.WARNING, logger="wavetrain.spark.neural"):
        model = _fit(spark, data, checkpoint=str(ck), callbacks=(DieOnce(str(marker), str(starts)),))
    assert marker.exists(), "rank 1 never died"
    assert model.train_info_["attempts"] == 2
    assert any("retry 1 of 5, from the checkpoint" in r.getMessage() for r in caplog.records)
    first = sorted(tuple(map(int, line.split())) for line in starts.read_text().split("\n") if line)
    per_epoch = model.history_[0]["iteration"]
    # both ranks started at step 1, then both again after epoch 1's checkpoint (not from scratch)
    assert first == [(0, 1), (0, per_epoch + 1), (1, 1), (1, per_epoch + 1)]
    assert [h["epoch"] for h in model.history_] == [1.0, 2.0, 3.0]
    assert (ck / "checkpoint.pt").is_file()
    assert _test_accuracy(model, data) >= 0.8


@pytest.mark.slow
def test_a_rank_user_error_is_not_retried(spark, data, tmp_path, caplog):
    ck = tmp_path / "ck"
    _write_checkpoint(build("cnn", dict(PARAMS, lr=0.01, epochs=1, valid_fraction=0.0)), data, ck)
    with (caplog.at_level(logging.WARNING, logger="wavetrain.spark.neural"),
          pytest.raises(UserError, match="the checkpoint was written with other parameters")):
        _fit(spark, data, resume=str(ck), max_retries=5)     # refused by the ranks
    assert not [r for r in caplog.records if "retry" in r.getMessage()], "a user error was retried"


def _write_checkpoint(model, data, folder) -> None:
    """The checkpoint of ``model`` trained locally on a little of the data."""
    from wavetrain.models import FitOptions
    from wavetrain.train import ArrayStream

    windows = [(w, y) for task in data["train"][:2]
               for w, y, _, _ in part_windows(data["table"], task, model.feature_spec,
                                              Windowing.from_params(model.params))]
    stream = ArrayStream([w for w, _ in windows], np.array([y for _, y in windows]), data["labels"])
    model.fit(stream, options=FitOptions(checkpoint=str(folder)))
    assert (folder / "checkpoint.pt").is_file()


def test_more_processes_than_task_slots_is_a_user_error(spark, data):
    assert len(data["train"]) >= 3
    with pytest.raises(UserError, match="3 training processes need 3 Spark task slots"):
        fit_neural(spark, build("cnn", PARAMS), data["table"], data["train"], data["valid"], labels=data["labels"],
                   feature_dim=data["dim"], rate=None, channels=None, num_processes=3)


def test_more_processes_than_part_files_is_a_user_error(spark, data):
    with pytest.raises(UserError, match="train with at most 2 processes"):
        fit_neural(spark, build("cnn", PARAMS), data["table"], data["train"][:2], [], labels=data["labels"],
                   feature_dim=data["dim"], rate=None, channels=None, num_processes=3)


def test_failure_summary():
    text = "py4j...\nTraceback\n  File x\nRuntimeError: Command failed\nmore"
    assert summary(text) == "RuntimeError: Command failed"
    assert summary("first line\nsecond") == "first line"
