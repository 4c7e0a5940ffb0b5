"""Step strategies: how one training step runs on the hardware, and on how many processes.

The trainer's loop knows nothing of devices: it hands each prepared batch to a step strategy,
which runs forward, backward and the update, and gives back the loss. :class:`SingleDevice` is
one replica on one device (CPU or one GPU), alone or as one rank of a distributed-data-parallel
group, behind the same methods, and the loop does not change.

Distribution
------------
What differs when several processes train one model together is one object, a
:class:`Distribution`, chosen once per fit from its options (:func:`distribution_for`): this
process alone (:class:`OneProcess`) or one rank of a ``torch.distributed`` group
(:class:`RankGroup`). It adds sums over the ranks, cuts every rank's passes to the windows of the
smallest share, gives each rank its part of the global mini-batch, has rank 0 read what the
others are sent (the state resumed from), wraps the network so that gradients are averaged, and
gathers validation figures. A step strategy carries it; the families call it, and never ask
whether they are distributed. Nothing else touches ``torch.distributed``.

torch is imported only inside functions of this module.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from wavetrain.evaluation.metrics import macro_f1, scores, topk_accuracy
from wavetrain.stream.batches import WindowStream

__all__ = ["CapsWindows", "Distribution", "OneProcess", "RankGroup", "SingleDevice", "StepStrategy",
           "broadcast_from_first", "distribution_for", "evaluate", "evaluation_sums", "gather_ranks", "make_optimizer",
           "metrics_from_sums", "predict_logits", "rank", "train_step"]

T = TypeVar("T")


class StepStrategy(Protocol):
    """What the training loop needs of the hardware."""

    def set_lr(self, lr: float) -> None:
        """Learning rate of the next steps."""

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One forward, backward and update on the global batch ``x`` with labels ``y``; returns
        the mean loss of the batch (before the update)."""
        ...

    def evaluate(self, batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
        """Validation loss, top-1, top-5 and macro-F1 over prepared ``(x, y)`` batches (of every
        replica: the same figures on each)."""
        ...

    def reduce_sums(self, values: np.ndarray) -> np.ndarray:
        """Element-wise sums of ``values`` [float64] over the replicas that train together (one
        replica: ``values`` unchanged); every replica gets the same sums."""
        ...

    def weights(self) -> dict:
        """A CPU copy of the network's weights (the best ones are kept this way)."""
        ...

    def load_weights(self, state: dict) -> None:
        ...

    def state_dict(self) -> dict[str, Any]:
        """Network and optimiser state, for checkpoints."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...

    def report(self) -> dict[str, Any]:
        """Fields for the training history since the last report (a device group's shares)."""
        ...

    def close(self) -> None:
        """Training is over: stop any thread the strategy started (the trainer calls it once, at
        the end of ``fit``, after the best weights are back)."""


def make_optimizer(net, optimizer: str, lr: float, momentum: float, weight_decay: float):
    import torch

    if optimizer == "sgd":
        return torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)


def class_weighted_loss(logits, yt, class_weights, batch: int):
    """Cross-entropy summed over the rows, each row weighted by its class's weight (None: 1), and
    divided by ``batch``: the mean loss when unweighted, and additive over parts of a batch (a
    device group's shares add up to the whole batch's loss)."""
    import torch.nn.functional as F

    return F.cross_entropy(logits, yt, weight=class_weights, reduction="sum") / batch


def train_step(net, optimizer, x: np.ndarray, y: np.ndarray, device, class_weights=None) -> float:
    """One forward/backward/update on the batch ``x`` [shape=(batch, ...)] with labels ``y``.

    Returns the mean cross-entropy loss of the batch (before the update), each row weighted by
    its class's weight when ``class_weights`` (a tensor on ``device``) is given.
    """
    import torch

    net.train()
    xt = torch.from_numpy(x).to(device, non_blocking=True)
    yt = torch.from_numpy(y).to(device, non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    loss = class_weighted_loss(net(xt), yt, class_weights, len(y))
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def predict_logits(net, x: np.ndarray, device, chunk: int = 256) -> np.ndarray:
    """Logits ``(batch, K)`` of ``x`` in evaluation mode, ``chunk`` rows at a time."""
    import torch

    net.eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(x), chunk):
            out.append(net(torch.from_numpy(np.ascontiguousarray(x[s:s + chunk])).to(device)).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    """Log-probabilities of float64 logits ``z`` [shape=(n, K)] (``z`` is shifted in place)."""
    z -= z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def evaluate(net, batches: Iterator[tuple[np.ndarray, np.ndarray]] | Iterable[tuple[np.ndarray, np.ndarray]],
             device) -> dict[str, float]:
    """Loss, top-1, top-5 and macro-F1 over prepared ``(x, y)`` batches."""
    logits, ys = [], []
    for x, y in batches:
        logits.append(predict_logits(net, x, device))
        ys.append(y)
    if not ys:
        return {}
    y = np.concatenate(ys)
    logp = _log_softmax(np.concatenate(logits).astype(np.float64))
    proba = np.exp(logp)
    pred = proba.argmax(axis=1)
    return {"valid_loss": float(-logp[np.arange(len(y)), y].mean()),
            "top1": float((pred == y).mean()),
            "top5": topk_accuracy(proba, y, 5),
            "macro_f1": macro_f1(y, pred)}


#: Leading entries of :func:`evaluation_sums`: windows, loss sum, top-1 hits, top-5 hits.
_SUMS_HEAD = 4
_TOPK = 5


def evaluation_sums(net, batches: Iterable[tuple[np.ndarray, np.ndarray]], device, n_classes: int) -> np.ndarray:
    """What :func:`evaluate` reports, as sums that add over parts of the data: windows, loss
    sum, top-1 hits, top-5 hits, then the confusion counts ``(K, K + 1)`` flattened (float64).
    Memory holds one batch's logits at a time."""
    k = int(n_classes)
    out = np.zeros(_SUMS_HEAD + k * (k + 1))
    cm = out[_SUMS_HEAD:].reshape(k, k + 1)
    for x, y in batches:
        logp = _log_softmax(predict_logits(net, x, device).astype(np.float64))
        proba = np.exp(logp)
        pred = proba.argmax(axis=1)
        top = np.argpartition(-proba, min(_TOPK, k) - 1, axis=1)[:, :min(_TOPK, k)]
        out[:_SUMS_HEAD] += (len(y), -logp[np.arange(len(y)), y].sum(), (pred == y).sum(),
                             (top == y[:, None]).any(axis=1).sum())
        np.add.at(cm, (y, pred), 1)
    return out


def metrics_from_sums(sums: np.ndarray, n_classes: int) -> dict[str, float]:
    """:func:`evaluate`'s figures from :func:`evaluation_sums` (added over parts); ``{}`` when
    they count no window."""
    n = float(sums[0])
    if n == 0:
        return {}
    k = int(n_classes)
    cm = sums[_SUMS_HEAD:].reshape(k, k + 1)
    return {"valid_loss": float(sums[1] / n), "top1": float(sums[2] / n), "top5": float(sums[3] / n),
            "macro_f1": float(scores(cm, [str(c) for c in range(k)])["macro_f1"])}


# -- collectives of a torch.distributed group ------------------------------------------------------
def rank() -> int:
    """This process's rank in the ``torch.distributed`` group (0 when there is none)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """Ranks of the ``torch.distributed`` group (1 when there is none)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _comm_device():
    """Where collective tensors live: the current GPU with NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def gather_ranks(values: np.ndarray) -> np.ndarray:
    """Every rank's ``values`` (a float64 vector), stacked in rank order ``(ranks, n)``, on every
    rank: a reduction of them in that order gives bit-identical results everywhere."""
    import torch
    import torch.distributed as dist

    t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64).reshape(-1)).to(_comm_device())
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return np.stack([p.cpu().numpy() for p in parts])


def broadcast_from_first(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (pickled: for objects of the group's own processes)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0, device=_comm_device())
    return box[0]


@runtime_checkable
class CapsWindows(Protocol):
    """A stream whose passes can end after ``max_windows`` windows (None: all of them), e.g.
    :class:`wavetrain.spark.shards.TableStream`."""

    max_windows: int | None


# -- distribution ---------------------------------------------------------------------------------
class Distribution:
    """The processes that train one model together: the operations that differ when there are
    several (see the module's notes). :class:`OneProcess` and :class:`RankGroup` implement them;
    :func:`distribution_for` chooses one."""

    #: Devices this process shares each step over (a device group, two or more); empty: one device.
    devices: tuple[str, ...] = ()

    def gather(self, values: np.ndarray) -> np.ndarray:
        """Every process's ``values`` (a float64 vector) stacked in rank order ``(processes, n)``."""
        raise NotImplementedError

    def reduce_sums(self, values: np.ndarray) -> np.ndarray:
        """Element-wise sums of ``values`` [float64] over the processes (the same on each)."""
        raise NotImplementedError

    def batch_size(self, batch_size: int) -> int:
        """This process's part of a global mini-batch of ``batch_size`` windows."""
        raise NotImplementedError

    def equal_share(self, stream: WindowStream, windows: int) -> WindowStream:
        """This process's training stream, its passes cut to ``windows`` windows when the
        processes must take equal steps per epoch (``windows``: the fewest any process holds)."""
        raise NotImplementedError

    def from_first(self, read: Callable[[], T]) -> T:
        """What ``read()`` gives on the first process (rank 0), on every process."""
        raise NotImplementedError

    def wrap(self, net, device):
        """The module a step runs forward and backward (gradients averaged over the processes)."""
        raise NotImplementedError

    def evaluate(self, net, batches: Iterable[tuple[np.ndarray, np.ndarray]], device,
                 n_classes: int | None) -> dict[str, float]:
        """:func:`evaluate`'s figures over the prepared batches of every process."""
        raise NotImplementedError


class OneProcess(Distribution):
    """This process trains alone (on ``devices`` when it is a device group)."""

    def __init__(self, devices: tuple[str, ...] = ()):
        self.devices = tuple(devices)

    def gather(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64).reshape(1, -1)

    def reduce_sums(self, values: np.ndarray) -> np.ndarray:
        return values

    def batch_size(self, batch_size: int) -> int:
        return batch_size

    def equal_share(self, stream: WindowStream, windows: int) -> WindowStream:
        return stream

    def from_first(self, read: Callable[[], T]) -> T:
        return read()

    def wrap(self, net, device):
        return net

    def evaluate(self, net, batches, device, n_classes: int | None) -> dict[str, float]:
        return evaluate(net, batches, device)


class RankGroup(Distribution):
    """This process is one rank of the ``torch.distributed`` group it has joined (initialised
    with ``torch.distributed.init_process_group``), on one device: sums are gathered from every
    rank in rank order (the same on each), every rank's passes yield the windows of the smallest
    share (``DistributedDataParallel`` needs equal steps), ``batch_size`` is the global
    mini-batch, rank 0 reads and sends, and gradients are averaged over the ranks."""

    def gather(self, values: np.ndarray) -> np.ndarray:
        return gather_ranks(values)

    def reduce_sums(self, values: np.ndarray) -> np.ndarray:
        return gather_ranks(values).sum(axis=0)

    def batch_size(self, batch_size: int) -> int:
        """``ceil(batch_size / ranks)``: with the ranks' gradients averaged, a distributed step is
        one step of ``batch_size`` windows, and an epoch takes as many steps as on one process
        (not ``1 / ranks`` of them)."""
        return max(1, -(-int(batch_size) // world_size()))

    def equal_share(self, stream: WindowStream, windows: int) -> WindowStream:
        """A copy of ``stream`` whose passes yield ``windows`` windows; its windows must all be
        labelled (as a rank's share of part tasks is)."""
        if not isinstance(stream, CapsWindows):
            raise TypeError(f"distributed training needs a stream that can cap its windows per pass "
                            f"(max_windows); {type(stream).__name__} cannot")
        share: Any = copy.copy(stream)
        share.max_windows = int(windows)
        return share

    def from_first(self, read: Callable[[], T]) -> T:
        return broadcast_from_first(read() if rank() == 0 else None)

    def wrap(self, net, device):
        """``net`` in ``DistributedDataParallel`` (rank 0's weights on every rank)."""
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(net, device_ids=[device] if device.type == "cuda" else None)

    def evaluate(self, net, batches, device, n_classes: int | None) -> dict[str, float]:
        # the bare network: ranks may hold different numbers of validation batches, and only the
        # one gather is a collective
        if n_classes is None:
            raise ValueError("a rank's evaluation needs the number of classes (confusion counts gathered)")
        return metrics_from_sums(self.reduce_sums(evaluation_sums(net, batches, device, n_classes)), n_classes)


def distribution_for(options: Any) -> Distribution:
    """The processes of a fit, chosen once from its options
    (:class:`~wavetrain.models.base.FitOptions`): one rank of the ``torch.distributed`` group
    when ``options.distributed``, else this process alone, on ``options.devices``."""
    if options.distributed:
        return RankGroup()
    return OneProcess(tuple(options.devices))


#: This process alone on one device.
ONE_PROCESS = OneProcess()


class SingleDevice:
    """One replica on one device: the whole batch forward and backward, then an update; with a
    :class:`RankGroup`, one rank of a distributed-data-parallel group (the network wrapped in
    ``DistributedDataParallel``, so each step's gradients are averaged over the ranks' batches;
    validation figures and training sums gathered from every rank, so all ranks see the same ones
    and agree on stopping and learning rates). Weights and checkpoints are those of the
    underlying network.

    Parameters
    ----------
    net : torch.nn.Module
    device : torch.device
    optimizer, lr, momentum, weight_decay
        The optimiser (``adam`` or ``sgd``) and its settings.
    class_weights : sequence of float, optional
        A loss weight per class (``class_weight=balanced``); None: every row weighs 1.
    distribution : Distribution, optional
        The processes that train together (default: this one alone).
    n_classes : int, optional
        Outputs of the network (the confusion counts a :class:`RankGroup` gathers for macro-F1).
    """

    def __init__(self, net, device, *, optimizer: str = "adam", lr: float = 1e-3, momentum: float = 0.9,
                 weight_decay: float = 0.0, class_weights=None, distribution: Distribution = ONE_PROCESS,
                 n_classes: int | None = None):
        import torch

        self.net = net.to(device)
        self.device = device
        self.distribution = distribution
        self.n_classes = n_classes
        self.optimizer = make_optimizer(self.net, optimizer, lr, momentum, weight_decay)
        self.class_weights = (None if class_weights is None else
                              torch.as_tensor(np.asarray(class_weights, np.float32), device=device))
        #: What a step runs (the network, or its distributed wrapper).
        self.module = distribution.wrap(self.net, device)

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        return train_step(self.module, self.optimizer, x, y, self.device, self.class_weights)

    def evaluate(self, batches) -> dict[str, float]:
        return self.distribution.evaluate(self.net, batches, self.device, self.n_classes)

    def reduce_sums(self, values: np.ndarray) -> np.ndarray:
        return self.distribution.reduce_sums(values)

    def weights(self) -> dict:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.net.state_dict().items()}

    def load_weights(self, state: dict) -> None:
        self.net.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.weights(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])

    def report(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass
