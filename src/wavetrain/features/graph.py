"""The feature front-end as ONNX nodes: samples ``(n,)`` in, the gram ``(frames, features)`` out,
computed as :func:`wavetrain.features.extract` computes it (``wavetrain export``).

Framing is a ``Gather`` of frame indices; the real DFT is a matrix product with the analysis
window folded into a cosine/sine matrix that the graph computes from a few constants (ONNX
runtimes fold it once when they load the graph, so the file holds no matrix); the mel bank, DCT
and bin resizing are matrices; PCEN's smoother is a ``Scan`` in float64; deltas, per-recording
normalisation and sliding CMVN are gathers, reductions and cumulative sums. A combined spec
extracts every part from the same samples and aligns the parts onto the first part's frames by
the rule of :mod:`wavetrain.features.combined`, computed from the clip length in the graph.

Not expressible as one graph of a mono clip: per-axis features (several channels) and spectral
extractors over the whole clip (``whole=true``: the FFT length would depend on the clip).
"""
from __future__ import annotations

from typing import Any, cast

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.core.graph import DOUBLE, FLOAT, Graph
from wavetrain.features.base import Extractor, SpectralConfig, fft_length
from wavetrain.features.embedding import EmbeddingExtractor
from wavetrain.features.extractors import LOG_EPS, MelExtractor, MFCCConfig, PCENExtractor
from wavetrain.features.filters import dct_matrix, mel_edges, mel_filters
from wavetrain.features.framing import get_window
from wavetrain.features.onnx_chain import ChainExtractor, Stage, graph_model
from wavetrain.features.processors import Processor
from wavetrain.features.spec import CombinedSpec, FeatureSpec

__all__ = ["check_exportable", "member_rows", "min_samples", "spec_graph"]


def check_exportable(spec: FeatureSpec) -> None:
    """Raise a one-line :class:`ParameterError` when ``spec`` cannot be written as a graph of a
    mono clip."""
    parts = spec.parts if isinstance(spec, CombinedSpec) else (spec,)
    for p in parts:
        if p.per_axis:
            raise ParameterError(f"export: {p.name} with per_axis=true needs several channels; an exported graph "
                                 "takes one mono clip (train on downmixed audio to export)")
        ext = p.build_extractor()
        if isinstance(spec, CombinedSpec) and ext.pad_to(1, p.rate or 1) > 1:
            raise ParameterError(f"export: {p.name} pads short clips, which a combined spec's graph does not align; "
                                 "export it alone")
        if ext.windowed and ext.config.whole:
            raise ParameterError(f"export: {p.name} with whole=true takes an FFT as long as the clip, which a graph "
                                 "of any clip length cannot hold; use a window_ms > 0")


def min_samples(spec: FeatureSpec, rate: int) -> int:
    """The fewest samples that give one frame of every part (shorter clips have no features)."""
    parts = spec.parts if isinstance(spec, CombinedSpec) else (spec,)
    out = 1
    for p in parts:
        ext = p.build_extractor()
        if not ext.config.whole and ext.pad_to(1, rate) < ext.frame_size(rate):
            out = max(out, ext.frame_size(rate))
    return out


def spec_graph(g: Graph, audio: str, spec: FeatureSpec, rate: int) -> str:
    """Nodes computing ``extract(audio, rate, spec)`` (``audio``: float32 ``(n,)`` already at
    ``rate``); returns the name of the float32 gram ``(frames, features)``."""
    check_exportable(spec)
    if not isinstance(spec, CombinedSpec):
        return _part(g, audio, spec, rate)
    grams = [_part(g, audio, p, rate) for p in spec.parts]
    n = g.dim(audio, 0)
    first = spec.parts[0]
    cols = [grams[0]]
    for part, gram in zip(spec.parts[1:], grams[1:]):
        idx = _nearest(g, first, part, n, g.dim(grams[0], 0), g.dim(gram, 0), rate)
        cols.append(g.op("Gather", gram, idx, axis=0))
    return g.op("Concat", *cols, axis=1)


# ---- one part ----------------------------------------------------------------------------------
def _part(g: Graph, audio: str, spec: FeatureSpec, rate: int) -> str:
    ext = spec.build_extractor()
    x = _EXTRACTORS[ext.name](g, audio, ext, rate)
    dim = ext.feature_dim(rate)
    for proc in spec.build_pipeline().processors:
        x = _PROCESSORS[proc.name](g, x, proc, dim)
        dim = proc.feature_dim(dim)
    return x


def _frames(g: Graph, audio: str, ext: Extractor, rate: int) -> tuple[str, int]:
    """``(frames (T, size), size)``; whole-clip: ``(1, n)`` and size 0 (known only when run)."""
    if ext.config.whole:
        return g.op("Unsqueeze", audio, g.i64(0)), 0
    size = ext.frame_size(rate)
    step = ext.frame_step(rate, size)
    n = g.dim(audio, 0)
    t = g.op("Add", g.op("Div", g.op("Sub", n, g.i64(size)), g.i64(step)), g.i64(1))
    # the samples as rows of `step` (cut or zero-padded to T + q - 1 rows): frame t is rows t .. t + q - 1
    # side by side, cut to `size` (copies, where a gather of every sample's index is several times slower)
    q = -(-size // step)
    rows = g.op("Add", t, g.i64(q - 1))
    length = g.op("Mul", rows, g.i64(step))
    x = g.op("Slice", audio, g.i64(0), length, g.i64(0))
    x = g.op("Pad", x, g.op("Concat", g.i64(0), g.op("Sub", length, g.dim(x, 0)), axis=0))
    x = g.op("Reshape", x, g.i64(-1, step))
    if q == 1:
        return g.op("Slice", x, g.i64(0), g.i64(size), g.i64(1)), size
    parts = [g.op("Slice", x, g.i64(j), g.op("Add", t, g.i64(j)), g.i64(0)) for j in range(q)]
    return g.op("Slice", g.op("Concat", *parts, axis=1), g.i64(0), g.i64(size), g.i64(1)), size


def _twiddles(g: Graph, rows: int, cols: int, n: int, *, scale: np.ndarray | None = None, first: int = 0) -> str:
    """``[cos | sin](2 pi r c / n)`` for ``r < rows``, ``first <= c < first + cols`` (rows scaled by
    ``scale``), from a few constants: the runtime computes (folds) the matrix once when it loads the
    graph, so the file holds none; ``r c mod n`` is exact in int64."""
    r = g.op("Unsqueeze", _arange(g, 0, rows), g.i64(1))
    c = g.op("Unsqueeze", _arange(g, first, first + cols), g.i64(0))
    rc = g.op("Mod", g.op("Mul", r, c), g.const(np.int64(n)))
    angle = g.op("Mul", g.cast(rc, FLOAT), g.const(np.float32(2 * np.pi / n)))
    cos, sin = g.op("Cos", angle), g.op("Sin", angle)
    if scale is not None:
        w = g.const(scale[:, None].astype(np.float32))
        cos, sin = g.op("Mul", cos, w), g.op("Mul", sin, w)
    return g.op("Concat", cos, sin, axis=1)


def _arange(g: Graph, start: int, stop: int) -> str:
    """``arange(start, stop)`` as int64, made in the graph (a ``Range`` of constants, folded)."""
    return g.op("Range", g.const(np.int64(start)), g.const(np.int64(stop)), g.const(np.int64(1)))


def _factors(n: int) -> tuple[int, int] | None:
    """``(n1, n2)`` with ``n1 n2 = n`` and ``n1`` near ``sqrt(2 n)`` (what balances the two stages of
    :func:`_power`), or None when no split does a fifth of the work of one matrix product: below
    that its extra nodes cost more than they save (measured with onnxruntime on one thread: a
    1,800-point transform 2.5x faster split, a 640-point one 10% slower)."""
    best = None
    for n1 in range(2, n):
        if n % n1 == 0:
            cost = 2 * n1 + 4 * (n // n1)
            if best is None or cost < best[0]:
                best = (cost, n1)
    return None if best is None or 5 * best[0] > n else (best[1], n // best[1])


def _power(g: Graph, audio: str, ext: Extractor, rate: int, lo: int, hi: int) -> str:
    """Power spectrum bins ``[lo, hi)`` of the windowed frames zero-padded to ``n_fft``.

    When ``n_fft = n1 n2`` splits well, in two stages of matrix products (Cooley-Tukey with
    ``n = n2 m1 + m2``, ``k = k1 + n1 k2``): ``n1``-point DFTs of the frames' ``n2`` interleaved
    columns, twiddles ``exp(-2 pi i m2 k1 / N)``, then ``n2``-point DFTs (about ``2 n1 + 4 n2``
    operations per sample instead of ``N``); else one product with ``w[n] [cos | sin](2 pi n k / N)``."""
    frames, size = _frames(g, audio, ext, rate)
    n_fft = fft_length(cast(SpectralConfig, ext.config).n_fft, size)
    window = get_window(cast(SpectralConfig, ext.config).window, size)
    split = _factors(n_fft)
    if split is None:
        spec = g.op("MatMul", frames, _twiddles(g, size, hi - lo, n_fft, scale=window, first=lo))
        sq = g.op("Mul", spec, spec)
        return g.reduce("ReduceSum", g.op("Reshape", sq, g.i64(-1, 2, hi - lo)), [1], keepdims=False)
    n1, n2 = split
    x = g.op("Mul", frames, g.const(window))
    if n_fft > size:
        x = g.op("Pad", x, g.i64(0, 0, 0, n_fft - size))
    x = g.op("Transpose", g.op("Reshape", x, g.i64(-1, n1, n2)), perm=[0, 2, 1])           # (T, m2, m1)
    y = g.op("MatMul", x, _twiddles(g, n1, n1, n1))                                          # (T, m2, [re|im] k1)
    # (the conjugate transform, exp(+i ...): a real signal's power spectrum is the same)
    # twiddle exp(2 pi i m2 k1 / N): [re, im] * (cos + i sin) = [re cos - im sin, re sin + im cos]
    tw = _twiddles(g, n2, n1, n_fft)
    cos, sin = (g.op("Slice", tw, g.i64(a), g.i64(a + n1), g.i64(1)) for a in (0, n1))
    re, im = (g.op("Slice", y, g.i64(a), g.i64(a + n1), g.i64(2)) for a in (0, n1))
    zr = g.op("Sub", g.op("Mul", re, cos), g.op("Mul", im, sin))
    zi = g.op("Add", g.op("Mul", re, sin), g.op("Mul", im, cos))
    z = g.op("Transpose", g.op("Concat", zr, zi, axis=1), perm=[0, 2, 1])                   # (T, k1, [re|im] m2)
    # the n2-point transform of complex rows as one real product: [re | im] @ [[cos, sin], [-sin, cos]]
    c = _twiddles(g, n2, n2, n2)
    cos2, sin2 = (g.op("Slice", c, g.i64(a), g.i64(a + n2), g.i64(1)) for a in (0, n2))
    basis = g.op("Concat", g.op("Concat", cos2, sin2, axis=1), g.op("Concat", g.op("Neg", sin2), cos2, axis=1),
                 axis=0)
    out = g.op("MatMul", z, basis)                                                           # (T, k1, [re|im] k2)
    sq = g.op("Mul", out, out)
    power = g.reduce("ReduceSum", g.op("Reshape", sq, g.i64(-1, n1, 2, n2)), [2], keepdims=False)   # (T, k1, k2)
    power = g.op("Reshape", g.op("Transpose", power, perm=[0, 2, 1]), g.i64(-1, n_fft))         # k = k1 + n1 k2
    return g.op("Slice", power, g.i64(lo), g.i64(hi), g.i64(1))


def _log(g: Graph, x: str) -> str:
    return g.op("Log", g.op("Add", x, g.const(np.float32(LOG_EPS))))


def _fft(g: Graph, audio: str, ext, rate: int) -> str:
    size = ext.frame_size(rate)
    lo, hi = ext._native(rate, size)
    resize = ext._state(rate, size)[2]
    x = g.op("Sqrt", _power(g, audio, ext, rate, lo, hi))
    if resize is not None:
        x = g.op("MatMul", x, g.const(resize))
    c = ext.config
    if c.norm == "max":
        x = g.op("Div", x, g.op("Max", g.reduce("ReduceMax", x, [1]), g.const(np.float32(1e-30))))
    elif c.norm == "l2":
        norm = g.op("Sqrt", g.reduce("ReduceSum", g.op("Mul", x, x), [1]))
        x = g.op("Div", x, g.op("Max", norm, g.const(np.float32(1e-30))))
    return _log(g, x) if c.log else x


def _mel_power(g: Graph, audio: str, ext: MelExtractor, rate: int) -> str:
    size = ext.frame_size(rate)
    args = ext.mel_args(rate, size)
    bank = mel_filters(*args)                                   # (bands, n_fft // 2 + 1)
    used = np.flatnonzero(bank.any(axis=0))
    lo, hi = (int(used[0]), int(used[-1]) + 1) if used.size else (0, 1)
    power = _power(g, audio, ext, rate, lo, hi)
    r, n_fft, bands, fmin, fmax, htk, norm, warp = args
    return g.op("MatMul", power, _mel_bank(g, r, n_fft, bands, fmin, fmax, htk, norm, warp, lo, hi))


def _mel_bank(g: Graph, rate: int, n_fft: int, bands: int, fmin: float, fmax: float, htk: bool, norm: str,
              warp: float, lo: int, hi: int) -> str:
    """The mel filter bank's bins ``[lo, hi)`` as ``(bins, bands)``, computed in the graph as
    :func:`~wavetrain.features.filters.mel_filters` computes it (float64 triangles from the band
    edges, then float32): a few hundred bytes of constants the runtime folds when it loads the graph,
    where the matrix itself holds ``bins x bands`` floats."""
    mel_f = mel_edges(bands, fmin, fmax, htk, warp)
    freqs = np.fft.rfftfreq(n_fft, 1.0 / rate)[lo:hi]
    fdiff = np.diff(mel_f)
    ramps = g.op("Sub", g.const(mel_f[:, None]), g.const(freqs[None, :]))                 # (bands + 2, bins)
    lower = g.op("Div", g.op("Neg", g.op("Slice", ramps, g.i64(0), g.i64(bands), g.i64(0))),
                 g.const(fdiff[:-1, None]))
    upper = g.op("Div", g.op("Slice", ramps, g.i64(2), g.i64(bands + 2), g.i64(0)), g.const(fdiff[1:, None]))
    w = g.op("Max", g.const(np.float64(0.0)), g.op("Min", lower, upper))
    if norm == "slaney":
        w = g.op("Mul", w, g.const((2.0 / (mel_f[2:bands + 2] - mel_f[:bands]))[:, None]))
    return g.op("Transpose", g.cast(w, FLOAT), perm=[1, 0])


def _mel(g: Graph, audio: str, ext: MelExtractor, rate: int) -> str:
    x = _mel_power(g, audio, ext, rate)
    if ext.name == "mfcc":
        c = cast(MFCCConfig, ext.config)
        return g.op("MatMul", _log(g, x), g.const(dct_matrix(c.bands, c.coeffs)))
    return _log(g, x) if ext.log else x


def _pcen(g: Graph, audio: str, ext: PCENExtractor, rate: int) -> str:
    """PCEN of the mel power in float64 (:func:`wavetrain.features.extractors.pcen`): the smoother
    ``M[t] = b S[t] + (1 - b) M[t-1]`` from ``M[-1] = S[0]`` as a ``Scan``, then the formulas."""
    from onnx import TensorProto, helper

    c = ext.config
    b = ext.smoothing(rate)
    s = g.cast(_mel_power(g, audio, ext, rate), DOUBLE)
    cb, c1b = g.const(np.float64(b)), g.const(np.float64(1.0 - b))
    bands = c.bands
    prev, x, new, out = "m_prev", "s_t", "m_new", "m_out"
    body = helper.make_graph(
        [helper.make_node("Mul", [x, cb], ["bs"]), helper.make_node("Mul", [prev, c1b], ["am"]),
         helper.make_node("Add", ["bs", "am"], [new]), helper.make_node("Identity", [new], [out])],
        "pcen_smoother",
        [helper.make_tensor_value_info(prev, TensorProto.DOUBLE, [bands]),
         helper.make_tensor_value_info(x, TensorProto.DOUBLE, [bands])],
        [helper.make_tensor_value_info(new, TensorProto.DOUBLE, [bands]),
         helper.make_tensor_value_info(out, TensorProto.DOUBLE, [bands])])
    first = g.op("Squeeze", g.op("Slice", s, g.i64(0), g.i64(1), g.i64(0)), g.i64(0))
    _, smooth = g.op("Scan", first, s, outputs=2, body=body, num_scan_inputs=1)
    one = g.const(np.float64(1.0))
    # (eps + M)^-gain in log space, as librosa: exp(-gain (log eps + log1p(M / eps)))
    t = g.op("Log", g.op("Add", one, g.op("Div", smooth, g.const(np.float64(c.eps)))))
    t = g.op("Mul", g.op("Add", t, g.const(np.float64(np.log(c.eps)))), g.const(np.float64(-c.gain)))
    t = g.op("Mul", g.op("Exp", t), s)
    if c.power == 0.0:
        t = g.op("Log", g.op("Add", one, t))
    elif c.bias == 0.0:
        t = g.op("Pow", t, g.const(np.float64(c.power)))
    else:
        t = g.op("Log", g.op("Add", one, g.op("Div", t, g.const(np.float64(c.bias)))))
        t = g.op("Sub", g.op("Exp", g.op("Mul", t, g.const(np.float64(c.power)))), one)
        t = g.op("Mul", t, g.const(np.float64(c.bias ** c.power)))
    return g.cast(t, FLOAT)


def _identity(g: Graph, audio: str, ext: Extractor, rate: int) -> str:
    return _frames(g, audio, ext, rate)[0]


def _rms(g: Graph, audio: str, ext: Extractor, rate: int) -> str:
    f = g.cast(_frames(g, audio, ext, rate)[0], DOUBLE)
    return g.cast(g.op("Sqrt", g.reduce("ReduceMean", g.op("Mul", f, f), [1])), FLOAT)


def _stats(g: Graph, audio: str, ext: Extractor, rate: int) -> str:
    a = g.op("Abs", _frames(g, audio, ext, rate)[0])
    ad = g.cast(a, DOUBLE)
    mean = g.reduce("ReduceMean", ad, [1])
    var = g.op("Sub", g.reduce("ReduceMean", g.op("Mul", ad, ad), [1]), g.op("Mul", mean, mean))
    sd = g.op("Sqrt", g.op("Max", var, g.const(np.float64(0.0))))
    return g.op("Concat", g.cast(mean, FLOAT), g.reduce("ReduceMin", a, [1]), g.reduce("ReduceMax", a, [1]),
                g.cast(sd, FLOAT), axis=1)


def _chain(g: Graph, audio: str, ext: Extractor, rate: int) -> str:
    """A chain of ONNX graphs (:mod:`wavetrain.features.onnx_chain`): the clip padded (centred) to its
    minimum length, its front-end's frames when it has one, then each stage's graph inlined,
    converted to this graph's opset."""
    from onnx import version_converter

    chain = cast(ChainExtractor, ext)
    n = g.dim(audio, 0)
    short = g.op("Max", g.op("Sub", g.i64(chain.pad_to(1, rate)), n), g.i64(0))
    left = g.op("Div", short, g.i64(2))
    padded = g.op("Pad", audio, g.op("Concat", left, g.op("Sub", short, left), axis=0))
    cur = g.op("Unsqueeze", padded, g.i64(1)) if chain.front is None else spec_graph(g, padded, chain.front, rate)
    for k, ((stage, path), dim) in enumerate(zip(chain.stages, chain.stage_dims())):
        model = graph_model(path, stage.output, stage.edit)
        if max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) != g.opset:
            model = version_converter.convert_version(model, g.opset)
        dims = model.graph.input[0].type.tensor_type.shape.dim
        inner = [d.dim_value if d.dim_value > 0 else -1 for d in dims[2:]]
        x = _affine(g, cur, stage)                                               # (units, features)
        if stage.framed:                          # the graph frames the sequence itself: (1, units, *inner)
            x = g.op("Reshape", x, g.i64(1, -1, *inner))
        else:                                     # one window per row: (frames, *the graph's input dims)
            frames = g.op("Add", g.op("Div", g.op("Sub", g.dim(cur, 0), g.i64(stage.window)), g.i64(stage.step)),
                          g.i64(1))
            starts = g.op("Mul", g.op("Range", g.const(np.int64(0)), g.scalar(frames), g.const(np.int64(1))),
                          g.const(np.int64(stage.step)))
            idx = g.op("Add", g.op("Unsqueeze", starts, g.i64(1)), _arange(g, 0, stage.window))
            x = g.op("Gather", x, idx, axis=0)                                   # (frames, window, features)
            x = g.op("Reshape", x, g.op("Concat", frames, g.i64(*[d.dim_value or -1 for d in dims[1:]]), axis=0))
        outs = g.inline(model.graph, {model.graph.input[0].name: x}, f"graph{k}")
        cur = g.op("Reshape", outs[model.graph.output[0].name], g.i64(-1, dim))     # (its first output)
    return cur


def _embedding(g: Graph, audio: str, ext: Extractor, rate: int) -> str:
    """A wavetrain network's embeddings (:mod:`wavetrain.features.embedding`): the clip zero-padded
    at its end to one window, the network's own front-end, its windows gathered, and the network's
    graph from windows to embeddings inlined (made at this graph's opset)."""
    import onnx

    emb = cast(EmbeddingExtractor, ext)
    window, step = emb.window
    n = g.dim(audio, 0)
    short = g.op("Max", g.op("Sub", g.i64(emb.pad_to(1, rate)), n), g.i64(0))
    gram = spec_graph(g, g.op("Pad", audio, g.op("Concat", g.i64(0), short, axis=0)), emb.front, rate)
    frames = g.op("Add", g.op("Div", g.op("Sub", g.dim(gram, 0), g.i64(window)), g.i64(step)), g.i64(1))
    starts = g.op("Mul", g.op("Range", g.const(np.int64(0)), g.scalar(frames), g.const(np.int64(1))),
                  g.const(np.int64(step)))
    idx = g.op("Add", g.op("Unsqueeze", starts, g.i64(1)), _arange(g, 0, window))
    windows = g.op("Gather", gram, idx, axis=0)                                  # (frames, window, features)
    sub = onnx.load_from_string(emb.graph_bytes(g.opset)).graph
    return g.inline(sub, {"windows": windows}, "embedding")["embedding"]


def _affine(g: Graph, x: str, stage: Stage) -> str:
    if stage.floor is not None:
        x = g.op("Max", x, g.const(np.float32(stage.floor)))
    if stage.scale != 1.0:
        x = g.op("Mul", x, g.const(np.float32(stage.scale)))
    if stage.shift != 0.0:
        x = g.op("Add", x, g.const(np.float32(stage.shift)))
    return x


_EXTRACTORS = {"fft": _fft, "mel": _mel, "logmel": _mel, "mfcc": _mel, "pcen": _pcen, "identity": _identity,
               "rms": _rms, "stats": _stats, "speech_embedding": _chain, "onnx": _chain,
               "embedding": _embedding}


# ---- processors --------------------------------------------------------------------------------
def _rows(g: Graph, x: str) -> tuple[str, str]:
    """``(T as a 1-element int64, arange(T))`` of a gram."""
    t = g.dim(x, 0)
    return t, g.op("Range", g.const(np.int64(0)), g.scalar(t), g.const(np.int64(1)))


def _delta(g: Graph, x: str, proc, dim: int) -> str:
    c = proc.config
    ns = np.arange(1, c.half + 1)
    w = ns.astype(np.float64) if c.weights == "linear" else np.ones(c.half)
    denom = 2.0 * float(np.sum(ns * w))
    parts = [x] if c.keep else []
    d = x
    for _ in range(c.order):
        t = g.dim(d, 0)
        padded = g.op("Pad", d, g.i64(c.half, 0, c.half, 0), mode="edge")       # edges repeated
        out = None
        for n, wn in zip(ns, w):
            fwd = g.op("Slice", padded, g.i64(c.half + n), g.op("Add", t, g.i64(c.half + n)), g.i64(0))
            bwd = g.op("Slice", padded, g.i64(c.half - n), g.op("Add", t, g.i64(c.half - n)), g.i64(0))
            term = g.op("Mul", g.const(np.float32(wn / denom)), g.op("Sub", fwd, bwd))
            out = term if out is None else g.op("Add", out, term)
        d = cast(str, out)
        parts.append(d)
    return g.op("Concat", *parts, axis=1) if len(parts) > 1 else parts[0]


def _normalize(g: Graph, x: str, proc, dim: int) -> str:
    c = proc.config
    ax = 0 if c.axis == "time" else 1
    y = g.cast(x, DOUBLE)
    if c.mean:
        y = g.op("Sub", y, g.reduce("ReduceMean", y, [ax]))
    if c.std:
        centred = g.op("Sub", y, g.reduce("ReduceMean", y, [ax]))
        sd = g.op("Sqrt", g.reduce("ReduceMean", g.op("Mul", centred, centred), [ax]))
        y = g.op("Div", y, g.op("Add", sd, g.const(np.float64(c.eps))))
    return g.cast(y, FLOAT)


def _cmvn(g: Graph, x: str, proc, dim: int) -> str:
    """:func:`wavetrain.features.processors.sliding_cmvn`: its windowed formula covers the whole
    recording when the window does (``window >= 2 T``: every frame's window is clipped to all)."""
    c = proc.config
    y = g.cast(x, DOUBLE)
    y = g.op("Sub", y, g.reduce("ReduceMean", y, [0]))
    if c.window_frames <= 0:
        if c.var:
            sd = g.op("Sqrt", g.reduce("ReduceMean", g.op("Mul", y, y), [0]))
            y = g.op("Div", y, g.op("Add", sd, g.const(np.float64(c.eps))))
        return g.cast(y, FLOAT)
    t, idx = _rows(g, y)
    wnd = c.window_frames
    lo = g.op("Max", g.op("Sub", idx, g.const(np.int64(wnd // 2))), g.const(np.int64(0)))
    hi = g.op("Min", g.op("Add", idx, g.const(np.int64((wnd - 1) // 2 + 1))), g.scalar(t))
    count = g.op("Unsqueeze", g.cast(g.op("Sub", hi, lo), DOUBLE), g.i64(1))
    zero_row = g.op("Mul", g.op("Slice", y, g.i64(0), g.i64(1), g.i64(0)), g.const(np.float64(0.0)))

    def window_sum(v: str) -> str:
        c1 = g.op("Concat", zero_row, g.op("CumSum", v, g.const(np.int64(0))), axis=0)   # c1[k] = sum of [0, k)
        return g.op("Sub", g.op("Gather", c1, hi, axis=0), g.op("Gather", c1, lo, axis=0))

    mean = g.op("Div", window_sum(y), count)
    out = g.op("Sub", y, mean)
    if c.var:
        m2 = g.op("Sub", g.op("Div", window_sum(g.op("Mul", y, y)), count), g.op("Mul", mean, mean))
        sd = g.op("Sqrt", g.op("Max", m2, g.const(np.float64(0.0))))
        out = g.op("Div", out, g.op("Add", sd, g.const(np.float64(c.eps))))
    return g.cast(out, FLOAT)


def _dct(g: Graph, x: str, proc, dim: int) -> str:
    return g.op("MatMul", x, g.const(dct_matrix(dim, proc.feature_dim(dim))))


def _lp_of(g: Graph, x: str, p: float, ax: int) -> str:
    a = g.op("Abs", g.cast(x, DOUBLE))
    if np.isinf(p):
        return g.reduce("ReduceMax", a, [ax])
    s = g.reduce("ReduceSum", g.op("Pow", a, g.const(np.float64(p))), [ax])
    return g.op("Pow", s, g.const(np.float64(1.0 / p)))


def _axis(proc: Processor) -> int:
    return 1 if cast(Any, proc.config).over == "features" else 0


def _lp(g: Graph, x: str, proc, dim: int) -> str:
    p = 1.0 if proc.name == "l1" else proc.config.p
    return g.cast(_lp_of(g, x, p, _axis(proc)), FLOAT)


def _lpnorm(g: Graph, x: str, proc, dim: int) -> str:
    c = proc.config
    norm = g.op("Max", _lp_of(g, x, c.p, _axis(proc)), g.const(np.float64(c.eps)))
    return g.cast(g.op("Div", g.cast(x, DOUBLE), norm), FLOAT)


def _pool(g: Graph, x: str, proc, dim: int) -> str:
    c = proc.config
    y = g.cast(x, DOUBLE)
    mean = g.reduce("ReduceMean", y, [0])
    out = []
    if c.mean:
        out.append(mean)
    if c.max:
        out.append(g.reduce("ReduceMax", y, [0]))
    if c.sd:
        centred = g.op("Sub", y, mean)
        out.append(g.op("Sqrt", g.reduce("ReduceMean", g.op("Mul", centred, centred), [0])))
    return g.cast(g.op("Concat", *out, axis=1) if len(out) > 1 else out[0], FLOAT)


_PROCESSORS = {"delta": _delta, "normalize": _normalize, "cmvn": _cmvn, "dct": _dct, "lp": _lp, "l1": _lp,
               "lpnorm": _lpnorm, "pool": _pool}


# ---- alignment of combined parts ---------------------------------------------------------------
def _geometry(part: FeatureSpec, rate: int) -> tuple[int, int, bool]:
    """``(size, step, on the extractor's grid)``; size and step 0 for whole-clip parts (the clip)."""
    ext = part.build_extractor()
    reduces = part.build_pipeline().n_frames(1000) != 1000
    if ext.config.whole:
        return 0, 0, True
    size = ext.frame_size(rate)
    return size, ext.frame_step(rate, size), not reduces


def _nearest(g: Graph, grid: FeatureSpec, part: FeatureSpec, n: str, t_grid: str, t: str, rate: int) -> str:
    """:func:`wavetrain.features.combined.nearest_frames` in the graph: for each of the ``t_grid``
    frames of the grid part of ``n`` samples, the index of ``part``'s frame (of ``t``) whose centre
    is nearest, clipped to its frames (all three lengths 1-element int64 tensors)."""
    j = g.op("Range", g.const(np.int64(0)), g.scalar(t_grid), g.const(np.int64(1)))
    size0, step0, on0 = _geometry(grid, rate)
    n0 = g.scalar(n)
    if size0 and on0:
        c2 = g.op("Add", g.op("Mul", j, g.const(np.int64(2 * step0))), g.const(np.int64(size0)))
    else:   # whole-clip or reduced first part: centres (2j + 1) n / (2 T)
        c2 = g.op("Div", g.op("Mul", g.op("Add", g.op("Mul", j, g.const(np.int64(2))), g.const(np.int64(1))), n0),
                  g.scalar(t_grid))
    size, step, on = _geometry(part, rate)
    if size and on:
        num = g.op("Add", g.op("Sub", c2, g.const(np.int64(size))), g.const(np.int64(step)))
        idx = g.op("Div", num, g.const(np.int64(2 * step)))
        # Div truncates towards zero: below zero it differs from floor, but the clip below makes both 0
    else:
        idx = g.op("Div", g.op("Mul", c2, g.scalar(t)), g.op("Mul", n0, g.const(np.int64(2))))
    last = g.scalar(g.op("Sub", t, g.i64(1)))
    return g.op("Min", g.op("Max", idx, g.const(np.int64(0))), last)


def member_rows(g: Graph, spec: CombinedSpec, k: int, t: str, rate: int) -> str | None:
    """:func:`wavetrain.features.combined.part_rows` in the graph: the rows of a window of ``t``
    combined frames (1-element int64) that give part ``k``'s own frames once each (the first row
    aligned to each), or None when every row is its own."""
    size0, step0, on0 = _geometry(spec.parts[0], rate)
    if k == 0 or not (size0 and on0):
        return None
    part = spec.parts[k]
    n = g.op("Add", g.op("Mul", g.op("Sub", t, g.i64(1)), g.i64(step0)), g.i64(size0))
    size, step, on = _geometry(part, rate)
    if size and on:
        t_part = g.op("Max", g.op("Add", g.op("Div", g.op("Sub", n, g.i64(size)), g.i64(step)), g.i64(1)), g.i64(1))
    else:
        t_part = g.i64(part.build_pipeline().n_frames(1))
    idx = _nearest(g, spec.parts[0], part, n, t, t_part, rate)
    # idx never decreases: a part frame's first row is where idx changes (and row 0)
    prev = g.op("Concat", g.i64(-1), g.op("Slice", idx, g.i64(0), g.op("Sub", t, g.i64(1)), g.i64(0)), axis=0)
    return g.op("Squeeze", g.op("NonZero", g.op("Not", g.op("Equal", idx, prev))), g.i64(0))
