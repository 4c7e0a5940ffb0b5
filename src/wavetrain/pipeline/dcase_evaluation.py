"""The evaluation of an anomaly detector as the DCASE task reports it (``evaluate --by``,
``plot roc --by``): each recording scored by the mean of its windows' anomaly scores, and the
figures per machine type, section and domain with the official score
(:mod:`wavetrain.evaluation.dcase_scores`), from one pass over the windows on any engine.
Nothing here parses arguments or prints.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wavetrain.core.errors import UserError
from wavetrain.data.dataset import Dataset
from wavetrain.evaluation.dcase_scores import dcase_report, domain_order, recording_scores
from wavetrain.evaluation.detection_metrics import detection_report
from wavetrain.evaluation.group_results import recordings_per_group, window_groups
from wavetrain.pipeline.engine import Engine
from wavetrain.pipeline.jobs import RunOptions, detector_normal_value, detector_scores, group_names

#: The labels ``--by`` names when it names none.
DEFAULT_LABELS = ("section", "domain")
#: The label taken for the machine type when ``--by`` names two labels and it has several values.
MACHINE_LABEL = "machine"


@dataclass(frozen=True)
class DcaseLayout:
    """The labels the scores are by.

    Attributes
    ----------
    section, domain : str
        The section's label and the domain's.
    domains : (str, str)
        The domain label's two values, source first.
    machine : str or None
        The machine type's label; None: the sections are of one type.
    """

    section: str
    domain: str
    domains: tuple[str, str]
    machine: str | None = None


def dcase_layout(ds: Dataset, names: str | Sequence[str] | None = None) -> DcaseLayout:
    """The labels of ``--by [MACHINE,]SECTION,DOMAIN`` on the recordings ``ds`` will score.

    Parameters
    ----------
    ds : Dataset
        The recordings to score (those with a value of the evaluated label).
    names : str or sequence of str, optional
        ``(section, domain)`` or ``(machine, section, domain)`` label names, or the text of
        ``--by`` (names joined by commas); none or empty: :data:`DEFAULT_LABELS`. With two, the
        label :data:`MACHINE_LABEL` is the machine type when it has several values.

    Raises
    ------
    UserError
        In one line: not two or three different names, a name that is not a label of ``ds``, a
        recording without a value of one, or a domain label without exactly two values (naming
        them).
    """
    if isinstance(names, str):
        names = names.split(",") if names.strip() else None
    given = names is not None
    names = [n.strip() for n in (names if names is not None else DEFAULT_LABELS)]
    if len(names) not in (2, 3) or not all(names) or len(set(names)) != len(names):
        raise UserError(f"--by {','.join(names)}: expected two or three different label names, SECTION,DOMAIN or "
                        "MACHINE,SECTION,DOMAIN (e.g. --by section,domain)")
    labels = ds.label_names()
    for n in names:
        if n not in labels:
            default = "" if given else " (the default; name the labels: --by SECTION,DOMAIN)"
            raise UserError(f"--by: no label named {n!r}{default}; labels here: {', '.join(labels) or '(none)'}")
    machine = names[0] if len(names) == 3 else None
    if machine is None and MACHINE_LABEL in labels and MACHINE_LABEL not in names \
            and len(ds.counts(MACHINE_LABEL)) > 1:
        machine = MACHINE_LABEL
    section, domain = names[-2:]
    for n in ([machine] if machine else []) + [section, domain]:
        missing = [r for r in ds if r.labels.get(n) in (None, "")]
        if missing:
            raise UserError(f"--by: {len(missing)} of {len(ds)} recordings have no value for {n!r} (first: "
                            f"{missing[0].source or missing[0].name}); give each one a value or narrow with --where")
    values = sorted(ds.counts(domain))
    try:
        domains = domain_order(values)
    except ValueError:
        raise UserError(f"--by: the domain label {domain!r} has {len(values)} value{'' if len(values) == 1 else 's'} "
                        f"({', '.join(values)}); the DCASE scores need two, source and target (narrow with --where, "
                        "or name another label: --by SECTION,DOMAIN)") from None
    return DcaseLayout(section, domain, domains, machine)


@dataclass
class RecordingScores:
    """A detector's scores of the recordings of a data set, each the mean of its windows', with
    the labels of a :class:`DcaseLayout` (arrays in data set order), and the windows they come from.

    Attributes
    ----------
    y : numpy.ndarray of int
        1 for an anomalous recording, 0 for a normal one.
    scores : numpy.ndarray
        The mean of its windows' anomaly scores; NaN for a recording without windows.
    section, domain, machine : numpy.ndarray of str
        Its section, domain and machine type (``machine`` None without one).
    window_y, window_scores, window_places : list
        Per window: 1 if anomalous, its anomaly score, its recording's place.
    skipped : list
        ``(recording, reason)`` of the recordings skipped as bad.
    """

    y: np.ndarray
    scores: np.ndarray
    section: np.ndarray
    domain: np.ndarray
    machine: np.ndarray | None
    window_y: list[int]
    window_scores: list[float]
    window_places: list[int]
    skipped: list

    def report(self, layout: DcaseLayout) -> dict:
        """:func:`~wavetrain.evaluation.dcase_scores.dcase_report` of the recordings, with the
        labels it is by (``section_label``, ``domain_label``, ``machine_label``) and
        ``recording_score``, the rule that scores a recording."""
        res = dcase_report(self.y, self.scores, self.section, self.domain, domains=layout.domains,
                           machine=self.machine)
        res.update(section_label=layout.section, domain_label=layout.domain, machine_label=layout.machine,
                   recording_score="mean of its windows' anomaly scores")
        return res


def recording_scores_by(model, ds: Dataset, label: str, normal: str, opts: RunOptions, layout: DcaseLayout, *,
                        engine: Engine | None = None) -> RecordingScores:
    """Score every window of ``ds`` once with the detector ``model`` and each recording by the
    mean of its windows' scores; a recording is anomalous when its ``label`` is not ``normal``.
    Every recording of ``ds`` must have a value of ``label`` and of the layout's labels
    (:func:`dcase_layout` checks the latter)."""
    key = ds.resolve_label(label)
    # each recording is its own group: a window's group is its recording's place in ds
    y_w, s_w, own, skipped = detector_scores(model, ds, label, normal, opts,
                                             groups=[str(i) for i in range(len(ds))], engine=engine)
    assert own is not None
    places = [int(g) for g in own]

    def column(name: str) -> np.ndarray:
        return np.asarray([r.labels[name] for r in ds], dtype=object)

    return RecordingScores(y=np.asarray([int(r.labels.get(key) != normal) for r in ds], dtype=np.int64),
                           scores=recording_scores(s_w, places, len(ds)), section=column(layout.section),
                           domain=column(layout.domain),
                           machine=column(layout.machine) if layout.machine else None,
                           window_y=y_w, window_scores=s_w, window_places=places, skipped=skipped)


def evaluate_by_section(model, ds: Dataset, label: str, opts: RunOptions, layout: DcaseLayout, *,
                        normal: str | None = None, engine: Engine | None = None) -> dict:
    """Evaluate a trained anomaly detector on ``ds`` as
    :func:`~wavetrain.pipeline.jobs.evaluate_detector` does (the pooled window figures, and with
    ``opts.group_by`` each group's) plus ``sections``: the figures per machine type, section and
    domain and the official score of the recordings' scores (:meth:`RecordingScores.report`),
    from one pass over the windows."""
    ds = ds.labelled(label)
    if len(ds) == 0:
        raise UserError(f"no recording has a value for label {label!r}")
    normal = detector_normal_value(model, ds, label, normal)
    names = group_names(ds, opts.group_by)
    rs = recording_scores_by(model, ds, label, normal, opts, layout, engine=engine)
    groups = None if names is None else window_groups(rs.window_places, names)
    res = detection_report(rs.window_y, rs.window_scores, model.threshold_, groups)
    if groups is not None:
        for g, n in recordings_per_group(groups, rs.window_places).items():
            res["groups"][g]["recordings"] = n
        res["group_by"] = opts.group_by
    res.update(detector=True, label=label, normal_value=normal, recordings=len(ds) - len(rs.skipped),
               skipped=list(ds.skipped) + list(rs.skipped), sections=rs.report(layout))
    return res
