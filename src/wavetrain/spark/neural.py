"""Distributed-data-parallel training of the neural families (``cnn``, ``dcase``) on Spark.

The driver hands :func:`train_rank` to ``pyspark.ml.torch.distributor.TorchDistributor``: a
barrier stage of ``num_processes`` tasks, each starting one torch process, a rank. Every rank
joins the process group (gloo; NCCL on GPUs), reads its share of the part tasks (``tasks[r::N]``)
as a :class:`~wavetrain.spark.shards.TableStream` and fits through the same ``fit`` as local
training, with ``FitOptions(distributed=True)``: the input normaliser is computed over every
share, each rank trains on as many windows per epoch as the smallest share holds (equal steps,
as ``DistributedDataParallel`` needs), gradients are averaged over the ranks, and every rank sees
the same validation figures (see :mod:`wavetrain.models._torch_common`). Rank 0 writes the
checkpoints and returns the fitted state.

A rank that dies fails the barrier stage; the driver runs the stage again, up to ``max_retries``
times, every rank resuming from the last checkpoint (rank 0 reads it and sends it to the others).
Without a checkpoint folder a temporary one is used (under the feature table's root when that is
a local path, else a temporary folder on this machine: resumable in local mode). A
:class:`~wavetrain.errors.UserError` in a rank (a checkpoint of another run, bad features) is
raised on the driver at once, never retried.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from wavetrain.errors import ParameterError, UserError
from wavetrain.models.base import FitOptions
from wavetrain.spark.jobs import job_progress
from wavetrain.spark.shards import PartTask, TableStream
from wavetrain.spark.table import FeatureTable
from wavetrain.train.checkpoint import checkpoint_path
from wavetrain.windows import Windowing

__all__ = ["RankJob", "fit_neural", "train_rank"]

log = logging.getLogger(__name__)

#: Longest wait of a rank in a collective: ranks with unequal shares wait for each other at the
#: end of the normaliser's pass, so this bounds the imbalance of one pass, not a rank's death
#: (a dead peer is seen at once).
COLLECTIVE_TIMEOUT = timedelta(hours=4)
#: Prefix of the line a rank writes to stderr for a :class:`UserError`; the driver finds it in the
#: failed stage's message and raises the error instead of retrying.
USER_ERROR_MARK = "wavetrain-user-error: "


@dataclass(frozen=True)
class RankJob:
    """What every rank needs (pickled to the executors): the unfitted model, the feature table,
    all part tasks, the data layout, the checkpoint folder and extra callbacks."""

    model: Any                          # an unfitted NeuralClassifier
    table: FeatureTable
    train_tasks: list[PartTask]
    valid_tasks: list[PartTask]
    labels: list[str]
    feature_dim: int
    rate: int | None
    channels: int | None
    checkpoint: str
    use_gpu: bool = False
    callbacks: tuple = ()

    def stream(self, tasks: Sequence[PartTask]) -> TableStream:
        """The windows of ``tasks`` as the model cuts them."""
        m = self.model
        return TableStream(self.table, tasks, m.feature_spec, Windowing.from_params(m.params), self.labels,
                           self.feature_dim, rate=self.rate, channels=self.channels)


def train_rank(job: RankJob, resume: str | None) -> dict[str, Any] | None:
    """Run by every rank (a process ``TorchDistributor`` started, with ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` set): fit ``job.model`` on this rank's share, resuming from
    the checkpoint in ``resume`` when given. Rank 0 returns the fitted model's state, history and
    training information; the other ranks return None."""
    import torch.distributed as dist

    from wavetrain.models._torch_common import import_torch

    torch = import_torch()
    device = "cpu"
    if job.use_gpu:             # TorchDistributor made this task's GPUs the visible ones
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("nccl" if job.use_gpu else "gloo", timeout=COLLECTIVE_TIMEOUT)
    try:
        r, n = dist.get_rank(), dist.get_world_size()
        model = job.model
        valid = job.stream(job.valid_tasks[r::n]) if job.valid_tasks else None
        options = FitOptions(device=device, checkpoint=job.checkpoint if r == 0 else None, resume=resume,
                             callbacks=job.callbacks, distributed=True)
        model.fit(job.stream(job.train_tasks[r::n]), valid, options)
        if r != 0:
            return None
        return {"state": model.state_dict(), "history": model.history_, "info": model.train_info_}
    except UserError as e:
        print(f"{USER_ERROR_MARK}{e}", file=sys.stderr, flush=True)
        raise
    finally:
        dist.destroy_process_group()


def fit_neural(spark: Any, model: Any, table: FeatureTable, train_tasks: Sequence[PartTask],
               valid_tasks: Sequence[PartTask], *, labels: list[str], feature_dim: int, rate: int | None,
               channels: int | None, num_processes: int = 2, checkpoint: str | None = None,
               resume: str | None = None, max_retries: int = 5, use_gpu: bool = False, progress: bool = False,
               callbacks: tuple = ()) -> Any:
    """Fit the neural ``model`` (``cnn``, ``dcase``) on ``num_processes`` distributed-data-parallel
    ranks.

    Parameters
    ----------
    spark : SparkSession
    model : NeuralClassifier
        Unfitted; fitted in place and returned.
    table : FeatureTable
    train_tasks, valid_tasks : list of PartTask
        The training and validation windows (label indices into ``labels`` filled in, none -1);
        rank ``r`` of ``N`` reads ``tasks[r::N]``. No validation tasks: no validation.
    labels, feature_dim, rate, channels
        The data's label values and feature layout (as ``Classifier.fit`` takes them from a stream).
    num_processes : int
        Ranks (one Spark task slot each, all at once: a barrier stage).
    checkpoint : str or None
        Folder that every executor reaches (rank 0 writes it, and reads it when resuming); None:
        a temporary one, deleted at the end.
    resume : str or None
        Checkpoint folder the first attempt continues from (as ``--resume``).
    max_retries : int
        Times a failed stage is run again, each from the last checkpoint.
    use_gpu : bool
        One GPU per rank (NCCL); the Spark tasks must have GPUs as resources.
    progress : bool
        Show a progress bar of the stage.
    callbacks : tuple
        Extra training callbacks run on every rank (picklable).

    Returns
    -------
    NeuralClassifier
        ``model``, fitted; ``train_info_`` adds ``processes`` and ``attempts``.
    """
    from wavetrain.models._torch_common import NeuralClassifier

    if not isinstance(model, NeuralClassifier):
        raise ParameterError(f"{model.name}: distributed-data-parallel training is for the neural families (cnn, "
                             "dcase)")
    n = int(num_processes)
    if n < 1:
        raise ParameterError(f"processes: expected at least 1 training process, got {num_processes}")
    if len(train_tasks) < n:
        raise UserError(f"the training recordings lie in {len(train_tasks)} part files of the feature table, "
                        f"fewer than the {n} training processes; train with at most {len(train_tasks)} processes")
    model.labels_, model.feature_dim_ = list(labels), int(feature_dim)
    model.feature_rate_, model.channels_ = rate, channels
    folder = _local_path(checkpoint) if checkpoint else _temporary_folder(table)
    job = RankJob(model, table, list(train_tasks), list(valid_tasks), list(labels), int(feature_dim), rate,
                  channels, folder, bool(use_gpu), tuple(callbacks))
    try:
        with job_progress(spark.sparkContext, f"train {model.name} on {n} processes", enable=progress):
            out, attempts = _run_ranks(job, n, max_retries, _local_path(resume) if resume else None)
    finally:
        if not checkpoint:
            shutil.rmtree(folder, ignore_errors=True)
    model.load_state_dict(out["state"])
    model.history_ = out["history"]
    model.train_info_ = dict(out["info"], processes=n, attempts=attempts)
    return model


def _run_ranks(job: RankJob, n: int, max_retries: int, resume: str | None) -> tuple[dict[str, Any], int]:
    """Run the ranks until a stage succeeds: ``(rank 0's result, attempts)``."""
    from pyspark.ml.torch.distributor import TorchDistributor

    attempt = 0
    while True:
        attempt += 1
        try:
            out = TorchDistributor(num_processes=n, local_mode=False, use_gpu=job.use_gpu).run(train_rank, job, resume)
            return out, attempt
        except Exception as e:  # noqa: BLE001 - a failed barrier stage comes in many types
            text = str(e)
            message = user_error_in(text)
            if message is not None:
                raise UserError(message) from None
            if attempt > max_retries:
                raise UserError(f"distributed training failed {attempt} times, the last time with {summary(text)}; "
                                "see the executors' logs") from None
            if checkpoint_path(job.checkpoint).is_file():
                resume = job.checkpoint
            log.warning("distributed training failed (%s); retry %d of %d, %s", summary(text), attempt, max_retries,
                        f"from the checkpoint in {resume}" if resume else "from the start (no checkpoint yet)")


def user_error_in(text: str) -> str | None:
    """The message of the user error a rank reported in a failed stage's ``text`` (None: none)."""
    m = re.search(re.escape(USER_ERROR_MARK) + r"(.*)", text)
    return m[1].strip() if m else None


def summary(text: str) -> str:
    """One line of a failed stage's message: its last ``...Error: ...`` line, else its first line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b", ln)]
    line = errors[-1] if errors else (lines[0] if lines else "no message")
    return line if len(line) <= 200 else line[:197] + "..."


def _local_path(folder: str) -> str:
    """An absolute path (executors may start elsewhere); URIs are refused: checkpoints are files."""
    if "://" in folder:
        raise ParameterError(f"checkpoint folder {folder}: expected a path that every executor reaches (a shared "
                             "file system), not a URI")
    return os.path.abspath(os.path.expanduser(folder))


def _temporary_folder(table: FeatureTable) -> str:
    """A new checkpoint folder for one training: under the table's root when that is a path (every
    executor reaches it), else on this machine."""
    if "://" in table.root:
        return tempfile.mkdtemp(prefix="wavetrain-train-")
    return table.scratch("train")
