"""A bounded, streaming summary of labelled vectors, and the block-wise nearest-neighbour search
over it (shared by ``knn`` and ``knn-anomaly``).

Each label keeps at most ``capacity`` vectors, each with a weight (how many input vectors it
stands for), as the KNN of the Java framework this project succeeds did: when a label is full,
its nearest pair of vectors is merged into their weighted mean (weights added).

How merging is done (exact greedy, batched): a label's vectors are appended to a buffer of
``2 × capacity`` rows; when the buffer is full (and once more at the end) it is reduced back to
``capacity`` rows by repeated nearest-pair merges. During a reduction every row keeps its nearest
neighbour and that distance (computed once, in blocks of rows, then maintained): a merge moves one
row to the weighted mean and removes the other, so only the merged row, the rows whose nearest
neighbour was one of the pair (recomputed) and the rows now nearer to the merged row (one
distance row) change. Each merge is therefore the exact nearest pair among the label's current
vectors at that moment, at O(buffer × dims) per merge instead of a full distance matrix. Merging in
batches instead of one vector at a time changes only *when* a pair is merged: a vector arriving
later can no longer join a pair merged before it arrived (as with merging on every arrival).

Provenance keys: every vector carries a key, ``ordinal × 2**32 + place`` (the ordinal of its
recording, its place among that recording's vectors: :meth:`VectorSummary.keys_for`; vectors
added without keys are numbered in arrival order), and a merged vector keeps the lower key of its
pair. A reduction first orders the buffer by key (a no-op when vectors arrive in key order, as a
local stream's do), ties go to the lower key, and the finished summary lists each label's rows in
key order: a reduction depends only on the set of keyed rows it is given.

Summaries of parts of the data combine with :meth:`VectorSummary.merge`, which is exactly
commutative (``a.merge(b)`` and ``b.merge(a)`` hold the same arrays): each label's rows become
the key-ordered union of both parts', reduced to ``capacity`` by the same greedy rule only when
that union exceeds the buffer (``2 × capacity`` rows). Hence, per label:

* if every part's vectors of the label together fit the buffer, no part and no merge reduces:
  whatever the split and whatever the order and tree of the merges, the finished rows are
  bit-identical to those of one summary fed every vector in key order (a local pass);
* more generally, if no merge but the last one that brings the label's rows together had to
  reduce, the result is the reduction of the union of the parts' rows, whatever the order and
  tree;
* beyond that, greedy reduction is not associative (``R(R(a ∪ b) ∪ c) ≠ R(a ∪ R(b ∪ c))``): the
  result is a deterministic function of the parts and of the shape of the merge tree (not of the
  operand order), so it is reproducible only when parts are merged along a tree fixed by the
  parts (e.g. folded in part order).

Memory: ``labels × 2 × capacity × (dims + 2)`` float64/int64 plus two ``2 × capacity`` arrays per
label and one block of distances (:data:`BLOCK_BYTES`); a merge that reduces also holds one
label's union (at most ``4 × capacity`` rows) at a time.

Distances: ``euclidean``, ``l1``, ``lp`` (Minkowski with ``p``), ``cosine`` (1 - cosine
similarity; a zero vector is at distance 1 from every vector). Internally a monotone "cost"
is compared (squared euclidean, the p-th power sum for ``lp``) and turned into the distance only
when it is reported.
"""
from __future__ import annotations

import numpy as np

from wavetrain.core.errors import ParameterError

__all__ = ["BLOCK_BYTES", "DISTANCES", "PLACE_BITS", "VectorSummary", "check_vectors", "distances", "nearest",
           "subwindows"]

#: The distances a summary knows.
DISTANCES = ("euclidean", "l1", "lp", "cosine")
#: Bound of one block of a distance matrix (float64) and of the (rows, cols, dims) difference
#: array ``l1``/``lp`` need.
BLOCK_BYTES = 8 << 20
#: Bits of a provenance key that number a vector's place in its recording (the rest: the ordinal).
PLACE_BITS = 32


def _check(distance: str, p: float) -> None:
    if distance not in DISTANCES:
        raise ParameterError(f"distance: expected one of {', '.join(DISTANCES)}, got {distance!r}")
    if distance == "lp" and not p >= 1:
        raise ParameterError(f"p: expected a number >= 1 for the lp distance, got {p}")


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.sqrt(np.einsum("ij,ij->i", x, x))
    return x / np.where(n > 0, n, 1.0)[:, None]


def _costs(a: np.ndarray, b: np.ndarray, distance: str, p: float) -> np.ndarray:
    """Monotone costs (rows of a × rows of b), in one piece (callers block)."""
    if distance == "euclidean":
        c = np.einsum("ij,ij->i", a, a)[:, None] + np.einsum("ij,ij->i", b, b)[None, :]
        c -= 2.0 * (a @ b.T)
        return np.maximum(c, 0.0, out=c)
    if distance == "cosine":
        return 1.0 - _unit(a) @ _unit(b).T
    diff = np.abs(a[:, None, :] - b[None, :, :])
    if distance == "l1":
        return diff.sum(axis=2)
    return (diff ** p).sum(axis=2)


def _to_distance(c: np.ndarray, distance: str, p: float) -> np.ndarray:
    if distance == "euclidean":
        return np.sqrt(c)
    if distance == "lp":
        return c ** (1.0 / p)
    return c


def _rows_per_block(cols: int, dims: int, distance: str) -> int:
    per_row = cols * 8 * (dims if distance in ("l1", "lp") else 2)
    return max(1, BLOCK_BYTES // max(per_row, 1))


def distances(a: np.ndarray, b: np.ndarray, distance: str = "euclidean", p: float = 2.0) -> np.ndarray:
    """Distance matrix (rows of a × rows of b), float64, computed in blocks."""
    _check(distance, p)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    out = np.empty((a.shape[0], b.shape[0]))
    step = _rows_per_block(b.shape[0], b.shape[1], distance)
    for s in range(0, a.shape[0], step):
        out[s:s + step] = _costs(a[s:s + step], b, distance, p)
    return _to_distance(out, distance, p)


def nearest(queries: np.ndarray, ref: np.ndarray, k: int, distance: str = "euclidean", p: float = 2.0
            ) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest rows of ``ref`` to each query: ``(indices, distances)``, both
    ``(queries, min(k, rows))``, nearest first (ties: lower row first). Queries are searched
    in blocks so that one block of distances stays under :data:`BLOCK_BYTES`."""
    _check(distance, p)
    q = np.asarray(queries, np.float64)
    ref = np.asarray(ref, np.float64)
    k = min(k, ref.shape[0])
    idx = np.empty((q.shape[0], k), dtype=np.int64)
    dist = np.empty((q.shape[0], k))
    step = _rows_per_block(ref.shape[0], ref.shape[1], distance)
    for s in range(0, q.shape[0], step):
        c = _costs(q[s:s + step], ref, distance, p)
        if k < ref.shape[0]:
            part = np.argpartition(c, k - 1, axis=1)[:, :k]
        else:
            part = np.broadcast_to(np.arange(ref.shape[0]), c.shape)
        pc = np.take_along_axis(c, part, axis=1)
        order = np.lexsort((part, pc), axis=1)               # by cost, then by row
        idx[s:s + step] = np.take_along_axis(part, order, axis=1)
        dist[s:s + step] = np.take_along_axis(pc, order, axis=1)
    return idx, _to_distance(dist, distance, p)


def subwindows(g: np.ndarray, frames: int, normalize: bool = False) -> np.ndarray:
    """A window's vectors: the means of groups of ``frames`` consecutive frames (the last group
    may be shorter), ``(ceil(n / frames), dims)`` float64; with ``normalize`` the window's mean
    over time is subtracted first."""
    g = np.asarray(g, np.float64)
    if normalize:
        g = g - g.mean(axis=0)
    if frames <= 1:
        return g
    n = g.shape[0]
    starts = np.arange(0, n, frames)
    sums = np.add.reduceat(g, starts, axis=0)
    counts = np.minimum(starts + frames, n) - starts
    return sums / counts[:, None]


class _Label:
    """One label's buffer of at most ``rows`` weighted, keyed vectors."""

    def __init__(self, rows: int, dims: int):
        self.x = np.empty((rows, dims))
        self.w = np.empty(rows)
        self.k = np.empty(rows, dtype=np.int64)
        self.n = 0

    def sort(self) -> None:
        """Order the rows by key (nothing moves when they already are)."""
        k = self.k[:self.n]
        if self.n > 1 and not (k[1:] > k[:-1]).all():
            order = np.argsort(k, kind="stable")
            self.x[:self.n] = self.x[:self.n][order]
            self.w[:self.n] = self.w[:self.n][order]
            self.k[:self.n] = k[order]


class VectorSummary:
    """At most ``capacity`` weighted vectors per label (see the module notes for the merging and
    for what :meth:`merge` guarantees).

    Parameters
    ----------
    n_labels, dims, capacity : int
    distance : str
        One of :data:`DISTANCES`.
    p : float
        Exponent of the ``lp`` distance.

    Attributes
    ----------
    seen : (n_labels,) float
        Weight added per label (input vectors, with weight 1 each; a label's weights add up to it).
    merges : int
        Merges done so far.
    """

    def __init__(self, n_labels: int, dims: int, capacity: int, distance: str = "euclidean", p: float = 2.0):
        if capacity < 1:
            raise ParameterError(f"capacity: expected an integer >= 1, got {capacity}")
        _check(distance, p)
        self.dims, self.capacity, self.distance, self.p = int(dims), int(capacity), distance, float(p)
        self._labels: list[_Label | None] = [None] * n_labels
        self._placed: dict[int, int] = {}          # vectors keyed so far, per recording ordinal
        self.seen = np.zeros(n_labels)
        self.merges = 0

    def keys_for(self, ordinal: int, m: int) -> np.ndarray:
        """Provenance keys of the next ``m`` vectors of recording ``ordinal`` (in their order):
        ``ordinal × 2**32 + place``, the places counted per ordinal by this summary. A recording's
        vectors must all go to one summary (merged ones then never share a key)."""
        start = self._placed.get(ordinal, 0)
        if not 0 <= ordinal < 1 << (63 - PLACE_BITS) or start + m > 1 << PLACE_BITS:
            raise ParameterError(f"VectorSummary.keys_for: ordinal {ordinal} with {start + m} vectors is beyond the "
                                 f"keys (ordinals below 2**{63 - PLACE_BITS}, 2**{PLACE_BITS} vectors each)")
        self._placed[ordinal] = start + m
        return (ordinal << PLACE_BITS) + np.arange(start, start + m, dtype=np.int64)

    def add(self, label: int, x: np.ndarray, weights: np.ndarray | None = None, keys: np.ndarray | None = None
            ) -> None:
        """Add vectors ``x`` (m, dims) of one label (weight 1 each unless ``weights``) with their
        provenance ``keys`` (m,) from :meth:`keys_for`; without keys they are numbered in arrival
        order (give keys to every call or to none)."""
        x = np.asarray(x, np.float64)
        if x.ndim != 2 or x.shape[1] != self.dims:
            raise ParameterError(f"VectorSummary.add: expected vectors of shape (m, {self.dims}), got {x.shape}")
        w = np.ones(x.shape[0]) if weights is None else np.asarray(weights, np.float64)
        k = self.keys_for(0, x.shape[0]) if keys is None else np.asarray(keys, np.int64)
        if k.shape != (x.shape[0],):
            raise ParameterError(f"VectorSummary.add: expected {x.shape[0]} keys, got shape {k.shape}")
        lab = self._labels[label]
        if lab is None:
            lab = self._labels[label] = _Label(2 * self.capacity, self.dims)
        self.seen[label] += float(w.sum())
        row, full = 0, lab.x.shape[0]
        while row < x.shape[0]:
            if lab.n == full:
                self._reduce(lab)
            take = min(x.shape[0] - row, full - lab.n)
            lab.x[lab.n:lab.n + take] = x[row:row + take]
            lab.w[lab.n:lab.n + take] = w[row:row + take]
            lab.k[lab.n:lab.n + take] = k[row:row + take]
            lab.n += take
            row += take

    def merge(self, other: VectorSummary) -> None:
        """Add the vectors of ``other``, a summary of other recordings with the same settings:
        each label's rows become the key-ordered union of both, reduced to ``capacity`` only when
        that union exceeds the buffer. ``other`` is left as it was. Exactly commutative; associative
        while no merge reduces (module notes).

        Raises
        ------
        ParameterError
            When the settings differ, or both summaries hold a vector of the same key (a
            recording read by two parts).
        """
        mine = (len(self._labels), self.dims, self.capacity, self.distance, self.p)
        theirs = (len(other._labels), other.dims, other.capacity, other.distance, other.p)
        if mine != theirs:
            raise ParameterError(f"VectorSummary.merge: summaries of other settings (labels, dims, capacity, distance, "
                                 f"p): {mine} and {theirs}")
        full = 2 * self.capacity
        for c, ob in enumerate(other._labels):
            lab = self._labels[c]
            if ob is None or ob.n == 0:
                if lab is not None:
                    lab.sort()
                continue
            if lab is None:
                lab = self._labels[c] = _Label(full, self.dims)
            k = np.concatenate([lab.k[:lab.n], ob.k[:ob.n]])
            order = np.argsort(k, kind="stable")
            k = k[order]
            if k.size > 1 and not (k[1:] > k[:-1]).all():
                raise ParameterError("VectorSummary.merge: both summaries hold vectors of one recording; give each "
                                     "recording's vectors to one part only")
            x = np.concatenate([lab.x[:lab.n], ob.x[:ob.n]])[order]
            w = np.concatenate([lab.w[:lab.n], ob.w[:ob.n]])[order]
            if k.size > full:
                union = _Label(k.size, self.dims)
                union.x[:], union.w[:], union.k[:], union.n = x, w, k, k.size
                self._reduce(union)
                x, w, k = union.x[:union.n], union.w[:union.n], union.k[:union.n]
            lab.x[:k.size], lab.w[:k.size], lab.k[:k.size], lab.n = x, w, k, k.size
        self.seen += other.seen
        self.merges += other.merges
        for o, m in other._placed.items():
            self._placed[o] = max(self._placed.get(o, 0), m)

    def finish(self) -> None:
        """Reduce every label to at most ``capacity`` vectors, its rows in key order."""
        for lab in self._labels:
            if lab is not None:
                lab.sort()
                if lab.n > self.capacity:
                    self._reduce(lab)

    def label_vectors(self, label: int) -> tuple[np.ndarray, np.ndarray]:
        """``(vectors (n, dims), weights (n,))`` of one label (copies; call :meth:`finish` first
        for at most ``capacity``, in key order)."""
        lab = self._labels[label]
        if lab is None:
            return np.zeros((0, self.dims)), np.zeros(0)
        return lab.x[:lab.n].copy(), lab.w[:lab.n].copy()

    def label_keys(self, label: int) -> np.ndarray:
        """Provenance keys ``(n,)`` of one label's rows (a merged row keeps the lower key)."""
        lab = self._labels[label]
        return np.zeros(0, np.int64) if lab is None else lab.k[:lab.n].copy()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All labels' ``(vectors (N, dims), weights (N,), label of each (N,))``, label by label."""
        parts = [self.label_vectors(c) for c in range(len(self._labels))]
        x = np.concatenate([v for v, _ in parts]) if parts else np.zeros((0, self.dims))
        w = np.concatenate([v for _, v in parts]) if parts else np.zeros(0)
        y = np.concatenate([np.full(len(v), c, dtype=np.int64) for c, (v, _) in enumerate(parts)]) \
            if parts else np.zeros(0, np.int64)
        return x, w, y

    # -- reduction -------------------------------------------------------------------------------
    def _reduce(self, lab: _Label) -> None:
        """Order the rows by key, then merge nearest pairs until ``capacity`` rows are left; rows
        are then compacted (still in key order: a merged row keeps the lower row and its key).

        Every live row k keeps ``nd[k]``, a lower bound of its nearest-neighbour cost, exact
        (with ``nn[k]``) unless ``dirty[k]``. After merging (i, j) into i, only the bound can be
        updated cheaply for rows whose neighbour was i or j and that are not at least as near to
        the new i; such rows are marked dirty and recomputed only when their bound is the
        smallest, so the pair merged is always the exact nearest one."""
        n, dist, p = lab.n, self.distance, self.p
        if n <= self.capacity:
            return
        lab.sort()
        x, w = lab.x[:n], lab.w[:n]
        # the rows costs are computed against: x itself, its squared norms, or unit rows (cosine)
        sq = np.einsum("ij,ij->i", x, x) if dist == "euclidean" else None
        u = _unit(x) if dist == "cosine" else None
        pen = np.zeros(n)                                   # +inf on removed rows

        def cost_row(i: int) -> np.ndarray:
            if sq is not None:
                r = sq + (sq[i] - 2.0 * (x @ x[i]))
                np.maximum(r, 0.0, out=r)
            elif u is not None:
                r = 1.0 - u @ u[i]
            else:
                d = np.abs(x - x[i])
                r = d.sum(axis=1) if dist == "l1" else (d ** p).sum(axis=1)
            r += pen
            r[i] = np.inf
            return r

        nn = np.empty(n, dtype=np.int64)
        nd = np.empty(n)
        step = _rows_per_block(n, self.dims, dist)
        for s in range(0, n, step):
            c = _costs(x[s:s + step], x, dist, p)
            r = np.arange(s, min(s + step, n))
            c[r - s, r] = np.inf
            nn[s:s + step] = c.argmin(axis=1)
            nd[s:s + step] = c[r - s, nn[s:s + step]]
        dirty = np.zeros(n, dtype=bool)
        left = n
        while left > self.capacity:
            i = int(nd.argmin())
            if dirty[i]:
                r = cost_row(i)
                nn[i] = int(r.argmin())
                nd[i] = r[nn[i]]
                dirty[i] = False
                continue
            j = int(nn[i])
            if j < i:
                i, j = j, i                                  # keep the lower row
            wi, wj = w[i], w[j]
            x[i] = (wi * x[i] + wj * x[j]) / (wi + wj)
            w[i] = wi + wj
            if sq is not None:
                sq[i] = x[i] @ x[i]
            if u is not None:
                u[i] = _unit(x[i:i + 1])[0]
            pen[j] = nd[j] = np.inf
            dirty[j] = False
            left -= 1
            self.merges += 1
            row = cost_row(i)
            nn[i] = int(row.argmin())
            nd[i] = row[nn[i]]
            dirty[i] = False
            # every other live row: the new i is a candidate at cost row[k]
            near = row <= nd
            near[i] = False
            lost = ((nn == i) | (nn == j)) & ~near
            lost[i] = False
            lost[j] = False
            nn[near] = i
            nd[near] = row[near]
            dirty[near] = False
            dirty[lost] = True                               # bound nd[k] stays valid
        keep = np.flatnonzero(pen == 0)
        lab.x[:keep.size] = x[keep]
        lab.w[:keep.size] = w[keep]
        lab.k[:keep.size] = lab.k[:n][keep]
        lab.n = keep.size

    @staticmethod
    def bytes_needed(n_labels: int, dims: int, capacity: int, distance: str = "euclidean") -> int:
        """Peak bytes of a summary while it is filled: buffers (vectors, weights, keys), neighbour
        arrays, one block."""
        rows = 2 * capacity
        buffers = n_labels * rows * (dims + 2) * 8
        reduce = rows * (8 + 8 + 8 + 1) + min(BLOCK_BYTES, rows * rows * 8 * (dims if distance in ("l1", "lp")
                                                                                else 2))
        return buffers + reduce


def check_vectors(x: np.ndarray, w: np.ndarray, y: np.ndarray, n_labels: int, dims: int, capacity: int,
                  name: str) -> None:
    """Validate a summary loaded from a model file (raises :class:`ParameterError`)."""
    if x.ndim != 2 or x.shape[1] != dims or w.shape != (x.shape[0],) or y.shape != (x.shape[0],):
        raise ParameterError(f"{name}: summary vectors/weights/labels have shapes {x.shape}, {w.shape}, {y.shape}; "
                             f"expected (N, {dims}), (N,), (N,)")
    if x.shape[0] == 0 or (w <= 0).any() or not np.isfinite(x).all():
        raise ParameterError(f"{name}: the summary must hold vectors with finite values and positive weights")
    if (y < 0).any() or (y >= n_labels).any():
        raise ParameterError(f"{name}: summary labels must lie in 0..{n_labels - 1}")
    per_label = np.bincount(y, minlength=n_labels)
    if per_label.max() > capacity:
        raise ParameterError(f"{name}: the summary holds more than capacity={capacity} vectors for a label")
    if per_label.min() == 0:
        raise ParameterError(f"{name}: {int((per_label == 0).sum())} of the {n_labels} label values have no "
                             "summary vectors")
