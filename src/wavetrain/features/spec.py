"""Feature specifications: the :class:`FeatureSpec` value type and its string parser.

Grammar (whitespace free-form, names case-insensitive)::

    spec      := part ( "+" part )*
    part      := extractor ( "|" processor )*
    stage     := NAME [ "(" [ NAME "=" value ( "," NAME "=" value )* [","] ] ")" ]
    value     := number | true | false | none | NAME | PATH | 'text' | "text"

A ``PATH`` is a file name written without quotes: a word of letters, digits and ``_ . ~ / -``
holding a ``.`` or a ``/`` (``model=sections.wt``), kept as written.

Example: ``mfcc(coeffs=13) | delta(order=2)``.  Two or more parts joined by ``+`` make a
:class:`CombinedSpec` (``mfcc(coeffs=20) | delta + logmel(bands=64) | normalize``: ``|`` binds
tighter than ``+``, so each part has its own processors): one decode, each part extracted, the
parts' frames aligned onto the first part's frame grid and concatenated along the feature axis
(see :mod:`wavetrain.features.combined`).  ``str(spec)`` is canonical: every parameter
(defaults included) in a fixed order, so equal specs print equally and
``parse_spec(str(spec)) == spec``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from wavetrain.core.errors import ParameterError, SpecError
from wavetrain.features import embedding, extractors, onnx_chain, stats  # noqa: F401  (importing them registers them)
from wavetrain.features._params import Config, param_specs
from wavetrain.features.base import Extractor, FramedConfig
from wavetrain.features.processors import Pipeline
from wavetrain.features.registry import EXTRACTORS, PROCESSORS

__all__ = ["CombinedSpec", "FeatureSpec", "combine_specs", "describe_specs", "parse_spec", "warped_specs"]

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<path>[A-Za-z_~./][A-Za-z0-9_~./-]*[./][A-Za-z0-9_~./-]*)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>'[^']*'|"[^"]*")
  | (?P<punct>[(),=|+])
""", re.VERBOSE)


@dataclass(frozen=True)
class FeatureSpec:
    """An extractor config plus processor configs: frozen, hashable, canonical text.

    Parameters
    ----------
    extractor : FramedConfig
        Config of a registered extractor (e.g. ``LogMelConfig(bands=64)``).
    processors : tuple of Config, default=()
        Configs of registered processors, applied in order.

    Attributes
    ----------
    key : str
        16 hex chars of the sha256 of ``str(spec)``; stable across processes.
    rate : int or None
        Extraction sample rate in Hz (None = the input's rate).
    per_axis : bool
        Whether multi-channel input is processed per channel and concatenated.

    Examples
    --------
    >>> spec = parse_spec("logmel(bands=64)")
    >>> spec.feature_dim(16000), spec.n_frames(16000, 16000)
    (64, 49)
    """

    extractor: FramedConfig
    processors: tuple[Config, ...] = ()

    def __post_init__(self) -> None:
        if getattr(self.extractor, "stage", None) not in EXTRACTORS or \
                not isinstance(self.extractor, EXTRACTORS[self.extractor.stage].config_type):
            raise SpecError(f"FeatureSpec extractor must be an extractor config, "
                            f"got {type(self.extractor).__name__}")
        procs = tuple(self.processors)
        for p in procs:
            # "" for an object without a stage: p is then no instance of any registered config type
            cls = PROCESSORS.get(getattr(p, "stage", ""))
            if cls is None or not isinstance(p, cls.config_type):
                raise SpecError(f"FeatureSpec processors must be processor configs, "
                                f"got {type(p).__name__}")
        object.__setattr__(self, "processors", procs)

    def __str__(self) -> str:
        return " | ".join(str(c) for c in (self.extractor, *self.processors))

    def __repr__(self) -> str:
        return f"FeatureSpec({str(self)!r})"

    @property
    def key(self) -> str:
        return hashlib.sha256(str(self).encode("utf-8")).hexdigest()[:16]

    @property
    def rate(self) -> int | None:
        return self.extractor.rate

    @property
    def per_axis(self) -> bool:
        return self.extractor.per_axis

    @property
    def name(self) -> str:
        """Extractor name, e.g. ``'logmel'``."""
        return self.extractor.stage

    # ---- built objects -------------------------------------------------------------------
    def build_extractor(self) -> Extractor:
        """The extractor instance (:class:`~wavetrain.features.base.Extractor`)."""
        return EXTRACTORS[self.extractor.stage](self.extractor)

    def build_pipeline(self) -> Pipeline:
        """The processors as a :class:`~wavetrain.features.processors.Pipeline`."""
        return Pipeline([PROCESSORS[p.stage](p) for p in self.processors])

    def _rate(self, rate: int) -> int:
        return int(self.rate if self.rate is not None else rate)

    # ---- geometry ------------------------------------------------------------------------
    def feature_dim(self, rate: int, *, channels: int = 1) -> int:
        """Features per frame for an input at ``rate`` Hz.

        Parameters
        ----------
        rate : int
            Input sample rate in Hz (ignored when the spec sets ``rate``).
        channels : int, default=1
            Channels of the input; multiplies the extractor's features when ``per_axis``.
        """
        dim = self.build_extractor().feature_dim(self._rate(rate))
        if self.per_axis:
            dim *= channels
        return self.build_pipeline().feature_dim(dim)

    def n_frames(self, n_samples: int, rate: int) -> int:
        """Frames produced for ``n_samples`` at ``rate`` Hz (0 if shorter than a sub-window)."""
        r = self._rate(rate)
        n = n_samples if r == rate else _resampled_len(n_samples, rate, r)
        t = self.build_extractor().n_frames(n, r)
        return self.build_pipeline().n_frames(t) if t else 0

    def frame_shift_s(self, rate: int) -> float:
        """Seconds between frames (0.0 for whole-clip specs and specs whose processors reduce a clip
        to one frame)."""
        if self.processors and self.build_pipeline().n_frames(1 << 30) == 1:
            return 0.0
        return self.build_extractor().frame_shift(self._rate(rate))


def _resampled_len(n: int, rate_in: int, rate_out: int) -> int:
    from math import gcd
    g = gcd(int(rate_in), int(rate_out))
    up, down = rate_out // g, rate_in // g
    return -(-n * up // down)


@dataclass(frozen=True)
class CombinedSpec(FeatureSpec):
    """Two or more feature specs computed from one decode: ``SPEC_A + SPEC_B [+ ...]``.

    Each part is extracted (with its own processors) from the same samples; the parts' frames are
    aligned onto the first part's frame grid and concatenated along the feature axis, so
    ``feature_dim`` is the sum of the parts' and ``n_frames`` / ``frame_shift_s`` are the first
    part's.  Alignment: output frame ``t`` takes, from every other part, the frame whose centre is
    nearest in time to the centre of the first part's frame ``t`` (a tie goes to the later frame;
    a part with one frame per clip - ``whole=true`` or a reduction over time - repeats it).
    When the parts' frame grids agree (same sub-window and shift), frame ``t`` of every part is
    taken as is.  The parts must share ``rate`` and ``per_axis`` (one decode serves them all).

    Build one with :func:`combine_specs` or ``parse_spec("A + B")``; ``extractor`` and
    ``processors`` are the first part's (the frame grid), :attr:`parts` all of them.
    """

    parts: tuple[FeatureSpec, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        parts = tuple(self.parts)
        if len(parts) < 2:
            raise SpecError("a combined spec needs two or more parts (A + B)")
        for k, p in enumerate(parts):
            if not isinstance(p, FeatureSpec) or isinstance(p, CombinedSpec):
                raise _part_error(k, f"a combined spec's parts must be plain feature specs, got {type(p).__name__}")
            if p.rate != parts[0].rate:
                raise _part_error(k, f"the parts of a combined spec must share rate= (one decode serves them "
                                     f"all): {p.name} has rate={p.rate}, {parts[0].name} rate={parts[0].rate}")
            if p.per_axis != parts[0].per_axis:
                raise _part_error(k, f"the parts of a combined spec must share per_axis= ({p.name} has "
                                     f"per_axis={str(p.per_axis).lower()}, {parts[0].name} "
                                     f"per_axis={str(parts[0].per_axis).lower()})")
        if (self.extractor, self.processors) != (parts[0].extractor, parts[0].processors):
            raise SpecError("a combined spec's extractor and processors are its first part's")
        object.__setattr__(self, "parts", parts)

    def __str__(self) -> str:
        return " + ".join(str(p) for p in self.parts)

    def __repr__(self) -> str:
        return f"CombinedSpec({str(self)!r})"

    @property
    def name(self) -> str:
        """Extractor names joined by ``+``, e.g. ``'mfcc+logmel'``."""
        return "+".join(p.name for p in self.parts)

    def build_extractor(self) -> Extractor:
        raise SpecError(f"{self}: a combined spec has one extractor per part (see .parts); extract it with "
                        "wavetrain.features.extract")

    def build_pipeline(self) -> Pipeline:
        raise SpecError(f"{self}: a combined spec has processors per part (see .parts)")

    def feature_dim(self, rate: int, *, channels: int = 1) -> int:
        return sum(p.feature_dim(rate, channels=channels) for p in self.parts)

    def n_frames(self, n_samples: int, rate: int) -> int:
        return self.parts[0].n_frames(n_samples, rate)

    def frame_shift_s(self, rate: int) -> float:
        return self.parts[0].frame_shift_s(rate)

    def part_dims(self, rate: int, *, channels: int = 1) -> list[int]:
        """Features per frame of each part, in order (its columns of the combined gram)."""
        return [p.feature_dim(rate, channels=channels) for p in self.parts]


def warped_specs(spec: FeatureSpec | str, warps: Sequence[float]) -> FeatureSpec:
    """``spec`` computed at each vocal tract length warp of ``warps`` (its mel extractor's
    ``warp``), side by side: ``spec(warp=w1) + spec(warp=w2) + ...`` on one frame grid (one spec
    for one warp). Raises :class:`SpecError` for a spec whose extractor has no mel filter bank to
    warp, or that is already combined."""
    spec = parse_spec(spec)
    if isinstance(spec, CombinedSpec) or not hasattr(spec.extractor, "warp"):
        raise SpecError(f"{spec}: frequency warping needs one mel-family extractor (mel, logmel, mfcc, pcen) "
                        f"with its processors, not {spec.name}")
    extractor: Any = spec.extractor           # (a mel-family config: it has a warp)
    return combine_specs([FeatureSpec(dataclasses.replace(extractor, warp=float(w)), spec.processors) for w in warps])


def _part_error(k: int, msg: str) -> SpecError:
    e = SpecError(msg)
    e.part = k  # type: ignore[attr-defined]  # which part, for the parser's column
    return e


def combine_specs(specs: Sequence[FeatureSpec | str]) -> FeatureSpec:
    """The combined spec ``specs[0] + specs[1] + ...`` (see :class:`CombinedSpec`); parts that are
    themselves combined are flattened, and a single spec is returned as is.

    Raises
    ------
    SpecError
        No specs, or parts that differ in ``rate`` or ``per_axis``.
    """
    parts: list[FeatureSpec] = []
    for s in specs:
        p = parse_spec(s)
        parts.extend(p.parts if isinstance(p, CombinedSpec) else (p,))
    if not parts:
        raise SpecError("combine_specs: no feature specs given")
    if len(parts) == 1:
        return parts[0]
    return CombinedSpec(parts[0].extractor, parts[0].processors, tuple(parts))


# ---- parser --------------------------------------------------------------------------------
class _Tok:
    __slots__ = ("kind", "text", "col")

    def __init__(self, kind: str, text: str, col: int) -> None:
        self.kind, self.text, self.col = kind, text, col


def _fail(text: str, col: int, msg: str) -> SpecError:
    return SpecError(f"invalid spec at column {col}: {msg} (in {text!r})")


def _tokens(text: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _fail(text, pos + 1, f"unexpected character {text[pos]!r}")
        kind = cast(str, m.lastgroup)  # every alternative of _TOKEN is a named group
        if kind != "ws":
            out.append(_Tok(kind, m.group(), pos + 1))
        pos = m.end()
    out.append(_Tok("end", "", len(text) + 1))
    return out


def _value(tok: _Tok) -> Any:
    if tok.kind == "number":
        t = tok.text
        return float(t) if any(c in t for c in ".eE") else int(t)
    if tok.kind == "string":
        return tok.text[1:-1]
    if tok.kind == "path":
        return tok.text
    low = tok.text.lower()
    return {"true": True, "false": False, "none": None, "null": None}.get(low, low)


def _stage(text: str, toks: list[_Tok], i: int, registry: dict, kind: str) -> tuple[Config, int]:
    tok = toks[i]
    if tok.kind != "name":
        what = "end of spec" if tok.kind == "end" else repr(tok.text)
        raise _fail(text, tok.col, f"expected {kind} name, found {what}")
    name = tok.text.lower()
    cls = registry.get(name)
    if cls is None:
        hint = ""
        if kind == "an extractor" and name in PROCESSORS:
            hint = f"; {name!r} is a processor and goes after '|'"
        elif kind == "a processor" and name in EXTRACTORS:
            hint = f"; {name!r} is an extractor and must come first"
        raise _fail(text, tok.col, f"unknown {kind.split()[-1]} {name!r} (expected one of: "
                    f"{', '.join(sorted(registry))}){hint}")
    ctype = cls.config_type
    allowed = ctype.field_order()
    args: dict[str, Any] = {}
    cols: dict[str, int] = {}
    i += 1
    if toks[i].text == "(":
        i += 1
        while toks[i].text != ")":
            pt = toks[i]
            if pt.kind != "name":
                raise _fail(text, pt.col, f"expected a parameter name or ')' in {name}(...), "
                            f"found {pt.text or 'end of spec'!r}")
            pname = pt.text.lower()
            if pname not in allowed:
                raise _fail(text, pt.col, f"unknown parameter {pt.text!r} for {name} "
                            f"(expected one of: {', '.join(allowed)})")
            if pname in args:
                raise _fail(text, pt.col, f"parameter {pname!r} given twice for {name}")
            if toks[i + 1].text != "=":
                raise _fail(text, toks[i + 1].col, f"expected '=' after {pname}")
            vt = toks[i + 2]
            if vt.kind not in ("number", "name", "path", "string"):
                raise _fail(text, vt.col, f"expected a value for {pname}, "
                            f"found {vt.text or 'end of spec'!r}")
            args[pname] = _value(vt)
            cols[pname] = vt.col
            i += 3
            if toks[i].text == ",":
                i += 1
            elif toks[i].text != ")":
                raise _fail(text, toks[i].col, f"expected ',' or ')' in {name}(...), "
                            f"found {toks[i].text or 'end of spec'!r}")
        i += 1
    try:
        config = ctype(**args)
    except ParameterError as exc:
        raise _fail(text, cols.get(exc.param or "", tok.col), str(exc)) from None
    return config, i


def parse_spec(spec: str | FeatureSpec) -> FeatureSpec:
    """Parse a feature spec string (a :class:`FeatureSpec` is returned as is).

    Parameters
    ----------
    spec : str or FeatureSpec
        E.g. ``"logmel(bands=64, window_ms=40, shift_pct=50)"`` or
        ``"mfcc(coeffs=13) | delta(order=2)"``.

    Returns
    -------
    FeatureSpec

    Raises
    ------
    SpecError
        With the 1-based column of the error, e.g. ``invalid spec at column 8: unknown
        parameter 'band' for logmel (expected one of: bands, fmin, ...)``.
    """
    if isinstance(spec, FeatureSpec):
        return spec
    if not isinstance(spec, str):
        raise SpecError(f"a feature spec must be a string or FeatureSpec, got {type(spec).__name__}")
    toks = _tokens(spec)
    if toks[0].kind == "end":
        raise _fail(spec, 1, "empty spec (expected an extractor such as logmel(bands=64))")
    parts: list[FeatureSpec] = []
    i, cols = 0, [1]
    while True:
        extractor, i = _stage(spec, toks, i, EXTRACTORS, "an extractor")
        procs = []
        while toks[i].text == "|":
            proc, i = _stage(spec, toks, i + 1, PROCESSORS, "a processor")
            procs.append(proc)
        # made by an EXTRACTORS class's config_type, so a FramedConfig (FeatureSpec checks it again)
        parts.append(FeatureSpec(cast(FramedConfig, extractor), tuple(procs)))
        if toks[i].kind == "end":
            break
        if toks[i].text != "+":
            raise _fail(spec, toks[i].col, f"expected '|', '+' or end of spec, found {toks[i].text!r}")
        i += 1
        cols.append(toks[i].col)
    if len(parts) == 1:
        return parts[0]
    try:
        return combine_specs(parts)
    except SpecError as e:
        raise _fail(spec, cols[getattr(e, "part", 0)], str(e)) from None


def replace(spec: FeatureSpec, **changes: Any) -> FeatureSpec:
    """A copy of ``spec`` with extractor parameters changed (e.g. ``rate=16000``); for a
    :class:`CombinedSpec`, in every part."""
    if isinstance(spec, CombinedSpec):
        return combine_specs([replace(p, **changes) for p in spec.parts])
    return FeatureSpec(dataclasses.replace(spec.extractor, **changes), spec.processors)


def describe_specs() -> list[dict]:
    """Every registered extractor and processor with its parameters.

    Returns
    -------
    list of dict
        One dict per stage: ``name`` (str), ``kind`` (``'extractor'`` or ``'processor'``),
        ``doc`` (one line) and ``params`` (list of ``{name, default, doc}`` in canonical order).
    """
    out = []
    for kind, reg in (("extractor", EXTRACTORS), ("processor", PROCESSORS)):
        for name, cls in reg.items():
            doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
            out.append({"name": name, "kind": kind, "doc": doc, "params": param_specs(cls.config_type)})
    return out
