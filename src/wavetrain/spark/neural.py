"""Distributed-data-parallel training on Spark of the families that learn by gradient steps (the
neural classifiers, the autoencoder).

The driver hands :func:`train_rank` to ``pyspark.ml.torch.distributor.TorchDistributor``: a
barrier stage of ``num_processes`` tasks, each starting one torch process, a rank. Every rank
joins the process group (gloo; NCCL on GPUs), reads its share of the part tasks (``tasks[r::N]``)
as a :class:`~wavetrain.spark.shards.TableStream` and fits through the family's ``fit_rank``, the
local fit, with ``FitOptions(distributed=True)``: the input normaliser is computed over every
share, each rank trains on as many windows per epoch as the smallest share holds (equal steps,
as ``DistributedDataParallel`` needs), ``batch_size`` is the global mini-batch (each of N ranks
takes ``batch_size / N`` windows a step, so an epoch has as many steps as locally), gradients are
averaged over the ranks, and every rank sees
the same validation figures (see :mod:`wavetrain.models._torch_common`). Rank 0 writes the
checkpoints and returns the fitted state.

A rank that dies fails the barrier stage; the driver runs the stage again, up to ``max_retries``
times, every rank resuming from the last checkpoint (rank 0 reads it and sends it to the others).
When the rank died with its executor, the stage run again waits (up to :data:`SLOTS_WAIT_S`) for
the cluster to start a replacement: until then it lacks a task slot, which is no attempt.
Without a checkpoint folder a temporary one is used (under the feature table's root when that is
a local path, else a temporary folder on this machine: resumable in local mode). A
:class:`~wavetrain.core.errors.UserError` in a rank (a checkpoint of another run, bad features) is
written to the checkpoint folder, and the driver raises it at once instead of retrying (a failed
stage's exception carries no rank's message: ``TorchDistributor`` reports only that it failed).
"""
from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.models._torch_common import import_torch
from wavetrain.models.base import Classifier, FitOptions
from wavetrain.models.passes import RankFit
from wavetrain.spark.jobs import job_progress
from wavetrain.spark.session import interrupted
from wavetrain.spark.shards import Augmenting, PartTask, TableStream
from wavetrain.spark.table import FeatureTable
from wavetrain.stream.windows import Windowing
from wavetrain.train.checkpoint import checkpoint_path

__all__ = ["RankJob", "fit_neural", "train_rank"]

log = logging.getLogger(__name__)

#: Longest wait of a rank in a collective: ranks with unequal shares wait for each other at the
#: end of the normaliser's pass, so this bounds the imbalance of one pass, not a rank's death
#: (a dead peer is seen at once).
COLLECTIVE_TIMEOUT = timedelta(hours=4)
#: Name of the Spark error of a barrier stage that needs more task slots than the cluster has.
SLOTS_CHECK_FAILED = "BarrierJobSlotsNumberCheckFailed"
#: Longest wait, after a stage that had its slots failed, for the cluster to have them again (a
#: lost executor's replacement to register) before the training fails.
SLOTS_WAIT_S = 180.0
#: Pause between two submissions of a stage that waits for its slots.
SLOTS_POLL_S = 1.0
#: File in the checkpoint folder where rank N leaves the message of a :class:`UserError`.
USER_ERROR_FILE = "user-error-rank{}.txt"


@dataclass(frozen=True)
class RankJob:
    """What every rank needs (pickled to the executors): the unfitted model, the feature table,
    all part tasks, the data layout, the checkpoint folder, extra callbacks and how the training
    windows are augmented (None: they are not)."""

    model: Classifier                   # unfitted, learns by gradient steps
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
    augmenting: Augmenting | None = None
    transform: Callable[[np.ndarray], np.ndarray] | None = None

    def stream(self, tasks: Sequence[PartTask], *, train: bool = False) -> TableStream:
        """The windows of ``tasks`` as the model cuts them (augmented if ``train``, as a local
        training stream; validation windows stay clean)."""
        m = self.model
        aug = self.augmenting.for_tasks(tasks) if train and self.augmenting is not None else None
        return TableStream(self.table, tasks, m.feature_spec, Windowing.from_params(m.params), self.labels,
                           self.feature_dim, rate=self.rate, channels=self.channels, augmenting=aug,
                           transform=self.transform)


def train_rank(job: RankJob, resume: str | None) -> dict[str, Any] | None:
    """Run by every rank (a process ``TorchDistributor`` started, with ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` set): fit ``job.model`` on this rank's share, resuming from
    the checkpoint in ``resume`` when given. Rank 0 returns the fitted model's state, history and
    training information; the other ranks return None."""
    import torch.distributed as dist

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
        cast(RankFit, model).fit_rank(job.stream(job.train_tasks[r::n], train=True), valid, options)
        if r != 0:
            return None
        return {"state": model.state_dict(), "history": model.history_, "info": model.train_info_}
    except UserError as e:
        print(f"wavetrain: error: {e}", file=sys.stderr, flush=True)
        _leave_user_error(job.checkpoint, dist.get_rank(), str(e))
        raise
    finally:
        dist.destroy_process_group()


def fit_neural(spark: Any, model: Classifier, table: FeatureTable, train_tasks: Sequence[PartTask],
               valid_tasks: Sequence[PartTask], *, labels: list[str], feature_dim: int, rate: int | None,
               channels: int | None, num_processes: int = 2, checkpoint: str | None = None,
               resume: str | None = None, max_retries: int = 5, use_gpu: bool = False, progress: bool = False,
               callbacks: tuple = (), augmenting: Augmenting | None = None,
               transform: Callable[[np.ndarray], np.ndarray] | None = None) -> Classifier:
    """Fit ``model``, of a family that learns by gradient steps as distributed ranks, on
    ``num_processes`` distributed-data-parallel ranks (each runs its ``fit_rank``).

    Parameters
    ----------
    spark : SparkSession
    model : Classifier
        Unfitted; fitted in place and returned (a family that does not learn by gradient steps as
        distributed ranks is a :class:`ParameterError`). A detector's threshold is not set here.
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
    augmenting : Augmenting or None
        How each rank augments its training windows (each epoch's draw is the epoch's seed, as
        locally).
    transform : callable or None
        Applied to every window (an ensemble member's columns); ``feature_dim`` is its output's.

    Returns
    -------
    Classifier
        ``model``, fitted; ``train_info_`` adds ``processes`` and ``attempts``.
    """
    if not (model.learns_by == "sgd" and model.supports_distributed):
        raise ParameterError(f"{model.name}: distributed-data-parallel training is for the families that learn by "
                             "gradient steps as distributed ranks (supports_distributed)")
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
                  channels, folder, bool(use_gpu), tuple(callbacks), augmenting, transform)
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

    attempt, short_since = 0, None
    while True:
        attempt += 1
        _take_user_error(job.checkpoint)            # none left by an earlier run
        try:
            distributor = TorchDistributor(num_processes=n, local_mode=False, use_gpu=job.use_gpu)
            distributor.logger.setLevel(logging.WARNING)       # no "Started/Finished distributed training" lines
            out = distributor.run(train_rank, job, resume)
            if not isinstance(out, dict):
                raise RuntimeError(f"rank 0 returned {type(out).__name__}, not the fitted state")
            return out, attempt
        except Exception as e:  # noqa: BLE001 - a failed barrier stage comes in many types
            if interrupted():                        # cancelled by Ctrl-C: not a failure to retry
                raise KeyboardInterrupt from None
            text = str(e)
            message = _take_user_error(job.checkpoint)
            if message is not None:
                raise UserError(message) from None
            if SLOTS_CHECK_FAILED in text:
                if attempt == 1:                     # never had its slots: too many processes for the cluster
                    raise UserError(f"{n} training processes need {n} Spark task slots at once and the cluster "
                                    "has fewer; train with fewer processes or on more executors") from None
                # an earlier stage had its slots: an executor was lost and its replacement is not there yet
                if short_since is None:
                    short_since = time.monotonic()
                    log.warning("distributed training waits for %d Spark task slots (an executor was lost)", n)
                elif time.monotonic() - short_since > SLOTS_WAIT_S:
                    raise UserError(f"{n} training processes need {n} Spark task slots at once and the cluster "
                                    f"has had fewer for {SLOTS_WAIT_S:.0f} s since an executor was lost; train "
                                    "again when it has them, or with fewer processes") from None
                attempt -= 1                          # no training ran
                time.sleep(SLOTS_POLL_S)
                continue
            short_since = None
            if attempt > max_retries:
                raise UserError(f"distributed training failed {attempt} times, the last time with {summary(text)}; "
                                "see the executors' logs") from None
            if checkpoint_path(job.checkpoint).is_file():
                resume = job.checkpoint
            log.warning("distributed training failed (%s); retry %d of %d, %s", summary(text), attempt, max_retries,
                        f"from the checkpoint in {resume}" if resume else "from the start (no checkpoint yet)")


def _leave_user_error(folder: str, rank: int, message: str) -> None:
    """On a rank: leave the message of a user error for the driver (best effort)."""
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, USER_ERROR_FILE.format(rank)), "w", encoding="utf-8") as f:
            f.write(message)
    except OSError:
        pass


def _take_user_error(folder: str) -> str | None:
    """On the driver: the message of a user error a rank left in ``folder`` (the lowest rank's),
    removing every one; None when there is none (or the folder is not reachable from here)."""
    found = sorted(glob.glob(os.path.join(glob.escape(folder), USER_ERROR_FILE.format("*"))))
    messages = []
    for path in found:
        try:
            with open(path, encoding="utf-8") as f:
                messages.append(f.read().strip())
            os.remove(path)
        except OSError:
            continue
    return messages[0] if messages else None


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
