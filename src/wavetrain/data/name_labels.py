"""Labels from file names: a pattern such as ``{digit}_{speaker}_{take}`` matched against each
audio file's name, its fields becoming the recording's labels."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from wavetrain.core.errors import ParameterError
from wavetrain.data.audio import AUDIO_EXTENSIONS

_FIELD = re.compile(r"\{([^{}]*)\}")
#: What a field's name may hold: a label name a metadata.csv can carry too.
_LABEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
#: Fields that match a part of the name without making it a label.
_IGNORED = ("", "_")
#: Characters a field never matches: a field is a part of one name, never of a path.
_SEPARATORS = frozenset("/\\")
#: Parts a suggested pattern names at most (the last field takes the rest of the name).
_SUGGESTED_PARTS = 8


class NamePattern:
    """A file-name pattern: literal text and ``{name}`` fields (``{_}`` or ``{}``: a part ignored).

    A field matches the shortest run of characters (one at least, never a path separator) that
    lets the rest of the pattern match; the pattern matches the whole name without its extension
    (with it, when the pattern itself ends in an audio extension such as ``.wav``).

    Parameters
    ----------
    text : str
        The pattern, e.g. ``'{digit}_{speaker}_{take}'``.

    Raises
    ------
    ParameterError
        A pattern without a named field, with an unmatched brace, a path separator, a field name
        a label cannot have, or a field named twice.

    Examples
    --------
    >>> NamePattern("{digit}_{speaker}_{_}").labels(Path("0_george_12.wav"))
    {'digit': '0', 'speaker': 'george'}
    """

    def __init__(self, text: str):
        self.text = str(text)
        where = f"name pattern {self.text!r}"
        if not self.text.strip():
            raise ParameterError(f"{where}: empty; expected literal text and {{label}} fields, e.g. "
                                 "'{digit}_{speaker}_{take}'")
        tokens: list[tuple[bool, str | None]] = []          # (is a field, its label name / the literal text)
        pos = 0
        for m in [*_FIELD.finditer(self.text), None]:
            literal = self.text[pos:m.start() if m else len(self.text)]
            if "{" in literal or "}" in literal:
                raise ParameterError(f"{where}: unmatched {'{' if '{' in literal else '}'}; a field is a "
                                     "label name in braces, e.g. {speaker}")
            if _SEPARATORS & set(literal):
                raise ParameterError(f"{where}: holds a path separator; the pattern matches a file's name, "
                                     "not its folders")
            if literal:
                tokens.append((False, literal))
            if m is None:
                break
            name = m.group(1)
            if name in _IGNORED:
                tokens.append((True, None))
            elif not _LABEL_NAME.fullmatch(name):
                raise ParameterError(f"{where}: field {{{name}}}: a label name is letters, digits, '_', '-' and "
                                     "'.' ({_} or {} ignores a part of the name)")
            elif any(field and other == name for field, other in tokens):
                raise ParameterError(f"{where}: field {{{name}}} appears twice; name each field once "
                                     "({_} ignores a part of the name)")
            else:
                tokens.append((True, name))
            pos = m.end()
        fields = [name for field, name in tokens if field]
        if not fields:
            raise ParameterError(f"{where}: no field; name the labels in braces, e.g. '{{digit}}_{{speaker}}_{{take}}'")
        if not any(fields):
            raise ParameterError(f"{where}: every field is ignored; name at least one ({{digit}}, not {{_}})")
        self._tokens = tokens
        #: The label names the pattern gives, in pattern order.
        self.names: list[str] = [n for n in fields if n]
        tail = tokens[-1][1] if not tokens[-1][0] else ""
        self.whole_name = str(tail).lower().endswith(AUDIO_EXTENSIONS)

    def __repr__(self) -> str:
        return f"NamePattern({self.text!r})"

    def subject(self, path: str | Path) -> str:
        """What the pattern is matched against: the file's name without (or, for a pattern that
        ends in an audio extension, with) its extension."""
        p = Path(path)
        return p.name if self.whole_name else p.stem

    def labels(self, path: str | Path) -> dict[str, str] | None:
        """The labels the name of ``path`` gives, or None when it does not match."""
        name = self.subject(path)
        tokens, n = self._tokens, len(name)
        # can[i][p]: tokens[i:] match name[p:] exactly; computed from the end, so that each field
        # takes the shortest run that lets the rest match without trying every split of the name.
        can = [[False] * (n + 1) for _ in range(len(tokens) + 1)]
        can[-1][n] = True
        ends: list[list[int]] = [[] for _ in tokens]        # per field: the end the shortest run reaches, from each p
        for i in range(len(tokens) - 1, -1, -1):
            field, text = tokens[i]
            nxt, here = can[i + 1], can[i]
            if not field:
                size = len(str(text))
                for p in range(n - size + 1):
                    here[p] = nxt[p + size] and name.startswith(str(text), p)
                continue
            first = [n + 1] * (n + 2)       # the smallest q > p with nxt[q], within one run free of separators
            for p in range(n - 1, -1, -1):
                if name[p] in _SEPARATORS:
                    continue
                q = p + 1
                first[p] = q if nxt[q] else first[q] if q < n and name[q] not in _SEPARATORS else n + 1
                here[p] = first[p] <= n
            ends[i] = first
        if not can[0][0]:
            return None
        out: dict[str, str] = {}
        p = 0
        for i, (field, text) in enumerate(tokens):
            if not field:
                p += len(str(text))
                continue
            q = ends[i][p]
            if text:
                out[str(text)] = name[p:q]
            p = q
        return out


def suggest_pattern(name: str, label: str) -> str:
    """A pattern for names like ``name`` (a file's stem) that gives ``label`` from its first part
    and ignores the others: ``('0_george_0', 'digit')`` -> ``'{digit}_{_}_{_}'``; the parts are
    split on the separator the name uses most (``_``, ``-``, ``.`` or a space)."""
    field = label if _LABEL_NAME.fullmatch(label) else "label"
    counts = Counter(c for c in name if c in "_-. ")
    if not counts:
        return f"{{{field}}}"
    sep = counts.most_common(1)[0][0]
    parts = [p for p in name.split(sep)]
    if any(not p for p in parts):           # separators doubled or at an end: one field for the name
        return f"{{{field}}}"
    n = min(len(parts), _SUGGESTED_PARTS)
    return sep.join([f"{{{field}}}"] + ["{_}"] * (n - 1))
