"""What the Spark engine can train, decided from a family's capability tags (never its name).

Nothing here imports ``pyspark``: the command line asks before a Spark session starts.
"""
from __future__ import annotations

from wavetrain.models.base import Classifier

__all__ = ["spark_support"]


def _local_hint(model: Classifier | type[Classifier]) -> str:
    return f"train {model.name} with --engine local"


def spark_support(model: Classifier | type[Classifier]) -> str | None:
    """Why the Spark engine cannot train ``model`` (a family or an instance), or None when it can.

    A family trains on Spark when it learns by gradient steps as one rank of a distributed group
    (``learns_by == "sgd"`` and ``supports_distributed``), by passes of statistics on any
    executor (the ``any_executor`` tag: the Spark executor runs each pass as a job), or by its
    members when every member does.

    Parameters
    ----------
    model : Classifier or type of Classifier
        The model to train (its tags are class attributes, so the class answers the same).

    Returns
    -------
    str or None
        A one-line reason naming the family and the local engine, or None.

    Examples
    --------
    >>> from wavetrain.models import family
    >>> spark_support(family("gmm")) is None
    True
    >>> spark_support(family("ensemble")) is None
    True
    """
    if model.learns_by == "statistics" or model.detector:
        if model.any_executor:
            return None
        return (f"{model.name}: the Spark engine runs the families that learn by passes of statistics on any "
                f"executor, and this one learns from a local stream only; {_local_hint(model)}")
    if model.learns_by == "members":         # as its members do (a family: whichever members it is given)
        for i, member in enumerate(model.members() if isinstance(model, Classifier) else ()):
            reason = spark_support(member)
            if reason:
                return f"{model.name}: member {i + 1}: {reason}"
        return None
    if model.learns_by == "sgd":
        if model.supports_distributed:
            return None
        return (f"{model.name}: the Spark engine trains gradient-step models as distributed ranks, and this one "
                f"trains in one process; {_local_hint(model)}")
    return f"{model.name}: the Spark engine cannot tell how this family learns; {_local_hint(model)}"

