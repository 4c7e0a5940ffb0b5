"""Hostile inputs against the installed ``wavetrain``: the project's own corpus, counted.

Every case runs the ``wavetrain`` entry point of this environment in a process of its own, as a
user or an attacker would (or, for the scikit-learn estimators, a small Python script in a child;
for the server, one HTTP request to a ``wavetrain serve`` started for them), against scratch data
built in a temporary folder: a tone data set with a metadata.csv, a folder of class sub-folders,
models trained and graphs exported by the command line, graphs and model files edited by the test
suite's own case builders (``tests/models/test_onnx_safety.py``, ``tests/models/test_modelfile_safety.py``,
``tests/test_writers_safety.py``, ``tests/cli/test_fifo_inputs.py``, ``tests/cli/test_live.py``),
named pipes, links, a full disk (a 200 KiB tmpfs; skipped with a note where it cannot be mounted).

Kinds: ``writers`` (every output option pointed at what its command reads, in every spelling:
absolute, ``..``, ``.``, relative, a linked folder, a link to the file, a hard link; folders that
are, contain or lie inside the input), ``links`` (writes through planted links, a dangling link at
the feature store's ``CACHEDIR.TAG``, stale temporary files, ``kill -9`` then the next write),
``graphs`` (hostile ``.onnx`` files through info, classify, evaluate and serve), ``fifo`` (named
pipes and devices as inputs), ``model-files`` (``.wt`` files mutated many ways, and the named
damage), ``server`` (single requests to ``wavetrain serve``), ``spark`` (an unreachable master,
Ctrl-C while the JVM starts), ``sklearn``, ``live`` (``classify -`` on stdin), ``full-disk``.

Outcome of a case, the first that applies:

- ``data-loss``: a file outside the case's own output changed, appeared or went (content hashes of
  the whole scratch folder but the case's output, before and after: an input, a link's target),
  or an output was left half-written where the case says it must not be (a partial output folder
  after a failure, a stale temporary file);
- ``hang``: the case's timeout was hit;
- ``traceback``: "Traceback" or "Exception ignored" on stderr (the server's log, for requests), or
  an exit code other than 0, 2 and 130;
- ``multi-line``: an error (exit code other than 0) of more than one line on stderr;
- ``unexpected``: none of the above, but not what the case expects (another exit code or HTTP
  status, a terminal escape reaching the output, NaN printed as an answer, memory over the case's
  bound, a JVM left running);
- ``ok``: everything else.

Writes ``benchmarks/results/hostile.json`` (every case: kind, name, argv, rc, seconds, outcome, the
first line of stderr), and prints a table by kind.

    .venv/bin/python benchmarks/bench_hostile.py [--quick] [--only KIND ...] [--list] [--keep]
    .venv/bin/python benchmarks/bench_hostile.py --src OTHER/src --max-timeout 10 --out before.json

``--src`` runs the cases against another version's sources (the children's ``PYTHONPATH``; the
scratch data is built by this one), ``--max-timeout`` caps every case's timeout.

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): a couple of dozen cases of every kind but Spark's JVM
ones, results to $TMPDIR/wavetrain-bench/hostile.quick.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

sys.path.insert(0, str(_util.ROOT))        # the tests package: the suite's case builders

KINDS = ("writers", "links", "graphs", "fifo", "model-files", "server", "spark", "sklearn", "live", "full-disk")
OUTCOMES = ("ok", "traceback", "hang", "data-loss", "multi-line", "unexpected")
#: Priority of the outcomes when a case has several problems.
WORST_FIRST = ("data-loss", "hang", "traceback", "multi-line", "unexpected")
TMP_NAME = re.compile(r"^\..+\.tmp$")


# -- cases -------------------------------------------------------------------------------------------
@dataclass
class Case:
    kind: str
    name: str
    cwd: Path                       # the case's working folder (it may write there)
    out: Path                       # the case's own output (a file or folder; it may write there)
    argv: list[str] = field(default_factory=list)       # wavetrain's arguments (or what a special case does)
    python: str | None = None       # a Python script run in a child instead
    runner: Callable[[Case, Scratch], dict] | None = None   # a special case (HTTP, signals, kill -9)
    stdin: bytes | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 60.0
    expect: tuple[int, ...] = (2,)  # exit codes (HTTP statuses for server cases) the case expects
    allowed: list[Path] = field(default_factory=list)   # more paths it may write
    watch_extra: list[Path] = field(default_factory=list)
    setup: Callable[[Case], None] | None = None
    checks: list[Callable[[Case, dict], tuple[str, str] | None]] = field(default_factory=list)
    quick: bool = False
    out_dir: bool = False           # its output folder is made before it runs (for outputs inside it)


Check = Callable[[Case, dict], "tuple[str, str] | None"]


def no_nan_answer(case: Case, res: dict) -> tuple[str, str] | None:
    if re.search(r"(?<![A-Za-z])(nan|inf)(?![A-Za-z])", res.get("stdout", ""), re.I):
        return "unexpected", "NaN or inf printed as an answer"
    return None


def rss_below(mb: float) -> Check:
    def check(case: Case, res: dict) -> tuple[str, str] | None:
        if res.get("peak_rss_mb") is not None and res["peak_rss_mb"] > mb:
            return "unexpected", f"peak RSS {res['peak_rss_mb']:.0f} MB, over {mb:.0f} MB"
        return None
    return check


def no_partial(*paths: Path) -> Check:
    """After a failure, none of ``paths`` exists (written whole or not at all)."""
    def check(case: Case, res: dict) -> tuple[str, str] | None:
        if res.get("rc") != 0:
            left = [str(p) for p in paths if os.path.lexists(p)]
            if left:
                return "data-loss", f"partial output left after the failure: {left[0]}"
        return None
    return check


def no_temporaries(folder: Path) -> Check:
    def check(case: Case, res: dict) -> tuple[str, str] | None:
        left = [str(p) for p in folder.rglob("*") if TMP_NAME.match(p.name)] if folder.exists() else []
        if left:
            return "data-loss", f"temporary output left: {left[0]}"
        return None
    return check


# -- scratch data ------------------------------------------------------------------------------------
class Scratch:
    """The temporary folder of the corpus, its lazily built data and the child environment."""

    def __init__(self, root: Path, quick: bool, src: Path | None = None, max_timeout: float | None = None):
        self.root = root
        self.quick = quick
        self.max_timeout = max_timeout
        for sub in ("runs", "out", "links", "elsewhere", "cache", "tmp", "built"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.n = 0
        self._memo: dict[str, object] = {}
        self.notes: list[str] = []
        self.mounts: list[Path] = []
        self.cleanups: list[Callable[[], None]] = []
        self.backup = root.parent / (root.name + "-as-built")
        self.child_env = _util.single_thread_env({"WAVETRAIN_PROGRESS": "0", "WAVETRAIN_CACHE": str(root / "cache"),
                                                  "TMPDIR": str(root / "tmp")})
        import wavetrain
        from wavetrain.data.demo import WORDS

        #: The spoken words the children's wavetrain ships (the demo's input)
        self.words = WORDS
        if src is not None:                 # the children run these sources of wavetrain
            self.child_env["PYTHONPATH"] = str(src)
            self.words = src / WORDS.relative_to(Path(wavetrain.__path__[0]).parent)
        #: Never watched: the default feature store and the children's temporary folder.
        self.unwatched = {root / "cache", root / "tmp"}

    def new(self, kind: str, name: str, **kw) -> Case:
        self.n += 1
        cid = f"{self.n:04d}"
        return Case(kind=kind, name=name, cwd=self.root / "runs" / cid, out=self.root / "out" / cid, **kw)

    def limit(self, timeout: float) -> float:
        return min(timeout, self.max_timeout) if self.max_timeout else timeout

    def once(self, key: str, build: Callable[[], object]):
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def cli(self, *argv) -> None:
        """Build step: ``wavetrain argv``, which must succeed."""
        r = subprocess.run(_util.wavetrain_cmd() + [str(a) for a in argv], env=self.child_env, capture_output=True,
                           text=True, timeout=600, cwd=self.root / "tmp")
        if r.returncode:
            raise RuntimeError(f"build step failed: wavetrain {' '.join(map(str, argv))}\n{r.stderr[-3000:]}")

    def victim(self, case: Case, text: bytes = b"precious, not to be replaced\n") -> Path:
        """A file elsewhere, the target of a planted link."""
        folder = self.root / "elsewhere" / case.cwd.name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "victim.txt"
        path.write_bytes(text)
        return path

    # the builders
    def env(self) -> dict[str, Path]:
        """The writers' tests' data: data/ (8 tones, metadata.csv, a.png), classes/, models/ (m.wt,
        det.wt, m.png, det.png, m.onnx, spec.toml, track.txt)."""
        def build():
            import contextlib
            import io

            from tests.test_writers_safety import build_env

            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
                try:
                    return build_env(self.root)
                except BaseException:
                    sys.stderr.write(err.getvalue())
                    raise
        return self.once("env", build)

    def demo_csv(self) -> Path:
        def build():
            from wavetrain.data.demo import make_demo_dataset

            return Path(make_demo_dataset(self.root / "demo", per_combo=2, speeds=(15.0, 30.0), snrs=(10.0, 20.0),
                                          seconds=1.0))
        return self.once("demo", build)

    def demo_wav(self) -> Path:
        return sorted(self.demo_csv().parent.glob("*.wav"))[0]

    def graph(self, name: str) -> Path:
        """A model of the demo data trained (``MODELS[name]`` of the graph tests) and exported."""
        def build():
            from tests.models.test_onnx_safety import MODELS

            folder = self.root / "built" / "graphs"
            folder.mkdir(parents=True, exist_ok=True)
            wt, onnx = folder / f"{name}.wt", folder / f"{name}.onnx"
            self.cli("train", "--data", self.demo_csv(), *MODELS[name], "-o", wt)
            self.cli("export", "-m", wt, "-o", onnx)
            return onnx
        return self.once(f"graph {name}", build)

    def clip_model(self) -> Path:
        def build():
            path = self.root / "built" / "clip.wt"
            self.cli("train", "--data", self.demo_csv(), "--label", "state", "--model", "gmm", "--set",
                     "components=4", "--clip-ms", "500", "-o", path)
            return path
        return self.once("clip", build)

    def tone_wav(self, name: str, amp: float) -> Path:
        def build():
            import numpy as np
            import soundfile as sf

            path = self.root / "built" / name
            t = np.arange(16000) / 16000
            sf.write(path, (amp * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000)
            return path
        return self.once(f"wav {name}", build)

    def feats(self) -> Path:
        def build():
            path = self.root / "built" / "feats"
            self.cli("features", "--data", self.env()["data"], "--features", "logmel(bands=8)", "-o", path,
                     "--no-progress")
            return path
        return self.once("feats", build)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60]


# -- running a case -------------------------------------------------------------------------------
def snapshot(tops: list[Path], skip: set[Path]) -> dict[str, str]:
    """Every entry under ``tops`` (links not followed, pipes never opened): its content hash, its
    link target, or its kind."""
    out: dict[str, str] = {}
    for top in tops:
        if not os.path.lexists(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            d = Path(dirpath)
            dirnames[:] = [n for n in dirnames if d / n not in skip and n != "__pycache__"]
            for n in dirnames + filenames:
                p = d / n
                if p in skip:
                    continue
                st = os.lstat(p)
                if stat.S_ISLNK(st.st_mode):
                    out[str(p)] = "link:" + os.readlink(p)
                elif stat.S_ISDIR(st.st_mode):
                    out[str(p)] = "dir"
                elif stat.S_ISREG(st.st_mode):
                    h = hashlib.sha256()
                    with open(p, "rb") as f:
                        for chunk in iter(lambda: f.read(1 << 20), b""):
                            h.update(chunk)
                    out[str(p)] = h.hexdigest()
                else:
                    out[str(p)] = f"special:{stat.S_IFMT(st.st_mode)}"
    return out


def _under(path: str, roots: list[Path]) -> bool:
    p = Path(path)
    return any(p == r or r in p.parents for r in roots)


def run_child(cmd: list[str], *, cwd: Path, env: dict, stdin: bytes | None, timeout: float,
              keep_stdin_open: bool = False, tmp: Path,
              on_start: Callable[[subprocess.Popen], None] | None = None) -> dict:
    """``cmd`` in a new session; its exit code, output, wall time and peak RSS; killed (its whole
    process group) at ``timeout``. ``on_start(popen)`` runs in a thread once it started.

    The peak RSS is ``/usr/bin/time``'s (the command's own: a process forked from this one would
    carry this one's peak across ``exec`` in its ``getrusage`` maximum); without it, ``wait4``'s,
    which is then at least this process's size."""
    out_p, err_p, rss_p = tmp / f"{cwd.name}.out", tmp / f"{cwd.name}.err", tmp / f"{cwd.name}.rss"
    use_time = os.access(_util.GNU_TIME, os.X_OK)
    if use_time:
        cmd = [_util.GNU_TIME, "-o", str(rss_p), "-f", "%M", *cmd]
    with open(out_p, "wb") as fo, open(err_p, "wb") as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fo, stderr=fe, start_new_session=True,
                             stdin=subprocess.PIPE if (stdin is not None or keep_stdin_open) else subprocess.DEVNULL)
        if stdin is not None:
            def feed():
                try:
                    assert p.stdin is not None
                    p.stdin.write(stdin)
                    if not keep_stdin_open:
                        p.stdin.close()
                except (BrokenPipeError, OSError, ValueError):
                    pass
            threading.Thread(target=feed, daemon=True).start()
        if on_start is not None:
            threading.Thread(target=on_start, args=(p,), daemon=True).start()
        timed_out, pause, ru = False, 0.005, None
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                timed_out = True
                _killpg(p.pid)
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(pause)
            pause = min(0.05, pause * 1.5)
        wall = time.perf_counter() - t0
        rc = os.waitstatus_to_exitcode(status)
        p.returncode = rc
        if p.stdin:
            try:
                p.stdin.close()
            except OSError:
                pass
        _killpg(p.pid)                      # whatever it left in its group (a JVM, a worker)
    stdout = out_p.read_bytes().decode(errors="replace")
    stderr = err_p.read_bytes().decode(errors="replace")
    peak_kb: float | None = ru.ru_maxrss if ru else None
    if use_time:
        lines = rss_p.read_text().split() if rss_p.exists() else []
        peak_kb = int(lines[-1]) if lines and lines[-1].isdigit() else None
        rss_p.unlink(missing_ok=True)
    out_p.unlink()
    err_p.unlink()
    return {"rc": rc, "seconds": round(wall, 2), "stdout": stdout, "stderr": stderr, "timed_out": timed_out,
            "peak_rss_mb": round(peak_kb / 1024, 1) if peak_kb is not None else None}


def _killpg(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_case(case: Case, S: Scratch) -> dict:
    case.timeout = S.limit(case.timeout)
    shutil.rmtree(case.cwd, ignore_errors=True)
    case.cwd.mkdir(parents=True)
    if case.out_dir:
        case.out.mkdir(parents=True, exist_ok=True)
    if case.setup:
        case.setup(case)
    tops = [S.root, *case.watch_extra]
    own = [case.cwd, case.out, *case.allowed]
    before = snapshot(tops, S.unwatched)
    if case.runner:
        res = case.runner(case, S)
    else:
        cmd = [sys.executable, "-c", case.python] if case.python is not None else \
            _util.wavetrain_cmd() + [str(a) for a in case.argv]
        res = run_child(cmd, cwd=case.cwd, env={**S.child_env, **case.env}, stdin=case.stdin, timeout=case.timeout,
                        tmp=S.root / "tmp")
    after = snapshot(tops, S.unwatched)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k) and not _under(k, own))
    res["changed_outside"] = changed[:5]
    judge(case, res, changed)
    if changed:
        restore(S, changed, before)
    shutil.rmtree(case.cwd, ignore_errors=True)
    if os.path.isdir(case.out) and not os.path.islink(case.out):
        shutil.rmtree(case.out, ignore_errors=True)
    elif os.path.lexists(case.out):
        os.unlink(case.out)
    return res


def restore(S: Scratch, changed: list[str], before: dict[str, str]) -> None:
    """Undo what a case wrote outside its output, so that the cases after it meet the scratch data
    as built: what it added is removed, what it changed or removed comes back from the copy taken
    once everything was built (a case's own victim files are its own)."""
    for k in sorted(changed, key=len, reverse=True):
        p = Path(k)
        if k not in before and os.path.lexists(p):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink()
    for k in sorted(changed, key=len):
        p = Path(k)
        if k not in before or S.root not in p.parents:
            continue
        src = S.backup / p.relative_to(S.root)
        if not os.path.lexists(src):
            continue
        if os.path.lexists(p) and not (p.is_dir() and not p.is_symlink()):
            p.unlink()
        if src.is_symlink():
            p.symlink_to(os.readlink(src))
        elif src.is_dir():
            p.mkdir(exist_ok=True)
        else:
            shutil.copy2(src, p)


def judge(case: Case, res: dict, changed: list[str]) -> None:
    problems: list[tuple[str, str]] = list(res.pop("problems", []))
    http = res.get("http", False)
    err, rc = res.get("stderr", ""), res.get("rc")
    if changed:
        problems.append(("data-loss", f"written outside its output: {changed[0]}"
                                      + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else "")))
    if res.get("timed_out"):
        problems.append(("hang", f"no end within {case.timeout:g} s"))
    if "Traceback" in err or "Exception ignored" in err:
        problems.append(("traceback", "a traceback on stderr" + (" (the server's log)" if http else "")))
    elif not http and not res.get("timed_out") and rc not in (0, 2, 130):
        problems.append(("traceback", f"exit code {rc}"))
    for check in case.checks:
        found = check(case, res)
        if found:
            problems.append(found)
    if not http and not res.get("timed_out") and rc != 0 and len(err.strip().splitlines()) > 1:
        problems.append(("multi-line", f"an error of {len(err.strip().splitlines())} lines"))
    if not res.get("timed_out") and rc not in case.expect:
        what = "HTTP status" if http else "exit code"
        problems.append(("unexpected", f"{what} {rc}, expected {' or '.join(map(str, case.expect))}"))
    if "\x1b" in res.get("stdout", "") + err or "\x9b" in res.get("stdout", "") + err:
        problems.append(("unexpected", "a terminal escape reached the output"))
    outcomes = {o for o, _ in problems}
    res["outcome"] = next((o for o in WORST_FIRST if o in outcomes), "ok")
    res["problems"] = [f"{o}: {m}" for o, m in problems]


# -- 1. writers: outputs that are inputs -----------------------------------------------------------
def _file_spellings(case: Case, target: Path) -> dict[str, str]:
    """Ways to name ``target`` (a file); links are made in the case's folder by its setup."""
    return {
        "absolute": str(target),
        "dot-dot": str(target.parent / ".." / target.parent.name / target.name),
        "dot": str(target.parent / "." / target.name),
        "relative": os.path.relpath(target, case.cwd),
        "linked folder": str(case.cwd / "linked" / target.name),
        "link to the file": str(case.cwd / f"link-{target.name}"),
        "hard link": str(case.cwd / f"hard-{target.name}"),
    }


DIR_SPELLINGS = ("the folder", "the folder, dot-dot", "the folder, relative", "the folder, linked", "a parent",
                 "a sub-folder", "a sub-folder, linked", "a sub-folder, relative")


def _dir_spellings(case: Case, folder: Path) -> dict[str, str]:
    return {
        "the folder": str(folder),
        "the folder, dot-dot": str(folder / ".." / folder.name),
        "the folder, relative": os.path.relpath(folder, case.cwd),
        "the folder, linked": str(case.cwd / "linked"),
        "a parent": str(folder.parent),
        "a sub-folder": str(folder / "sub"),
        "a sub-folder, linked": str(case.cwd / "linked" / "sub"),
        "a sub-folder, relative": os.path.relpath(folder / "sub", case.cwd),
    }


def _link_setup(folder: Path, file: Path | None = None) -> Callable[[Case], None]:
    def setup(case: Case) -> None:
        (case.cwd / "linked").symlink_to(folder, target_is_directory=True)
        if file is not None:
            (case.cwd / f"link-{file.name}").symlink_to(file)
            os.link(file, case.cwd / f"hard-{file.name}")
    return setup


FILE_WRITERS = [  # name, argv ({T}: the output), the input it names
    ("classify -o", ["classify", "-m", "{models}/m.wt", "--data", "{data}", "-o", "{T}"], "{data}/metadata.csv"),
    ("classify -o, the model", ["classify", "-m", "{models}/m.wt", "--data", "{data}", "-o", "{T}"],
     "{models}/m.wt"),
    ("train -o", ["train", "--data", "{data}", "--label", "state", "--model", "gmm", "--no-cache", "-o", "{T}"],
     "{data}/metadata.csv"),
    ("train -o, a recording", ["train", "--data", "{data}", "--label", "state", "--model", "gmm", "--no-cache",
                               "-o", "{T}"], "{data}/r3.wav"),
    ("train --model spec -o", ["train", "--data", "{data}", "--label", "state", "--model", "{models}/spec.toml",
                               "--no-cache", "-o", "{T}"], "{models}/spec.toml"),
    ("sound label -o", ["sound", "label", "-m", "{models}/m.wt", "--data", "{data}", "-o", "{T}", "--overwrite"],
     "{data}/metadata.csv"),
    ("sound splice -o", ["sound", "splice", "--data", "{data}/metadata.csv", "-o", "{T}", "--overwrite"],
     "{data}/r1.wav"),
    ("plot -o", ["plot", "{data}/a.png", "-o", "{T}"], "{data}/a.png"),
    ("plot history -o", ["plot", "history", "-m", "{models}/m.png", "-o", "{T}"], "{models}/m.png"),
    ("export -o", ["export", "-m", "{models}/m.onnx", "-o", "{T}"], "{models}/m.onnx"),
    ("sound from-audacity -o", ["sound", "from-audacity", "{models}/track.txt", "--wav", "{data}/r0.wav", "-o",
                                "{T}", "--overwrite"], "{models}/track.txt"),
    ("evaluate --plot", ["evaluate", "--data", "{data}", "--label", "state", "-m", "{models}/m.png", "--plot", "{T}"],
     "{models}/m.png"),
]

DIR_WRITERS = [  # name, argv ({O}: the output folder), the input folder
    ("features -o", ["features", "--data", "{data}", "--features", "logmel(bands=8)", "-o", "{O}", "--no-progress"],
     "{data}"),
    ("classify --audacity", ["classify", "-m", "{models}/m.wt", "--data", "{data}", "--audacity", "{O}"], "{data}"),
    ("sound cut -o", ["sound", "cut", "--data", "{data}", "--clip-ms", "100", "-o", "{O}", "--overwrite"], "{data}"),
    ("sound augment -o", ["sound", "augment", "--data", "{data}", "--gain=-3:3", "-o", "{O}", "--overwrite"],
     "{data}"),
    ("sound group -o", ["sound", "group", "--data", "{classes}", "--label", "class", "-o", "{O}", "--overwrite"],
     "{classes}"),
    ("sound group --copy -o", ["sound", "group", "--data", "{classes}", "--label", "class", "--copy", "-o", "{O}",
                               "--overwrite"], "{classes}"),
    ("sound partition -o", ["sound", "partition", "--data", "{data}", "--label", "state", "-o", "{O}",
                            "--overwrite"], "{data}"),
    ("sound to-audacity -o", ["sound", "to-audacity", "--data", "{data}", "-o", "{O}", "--overwrite"], "{data}"),
    ("train --cache", ["train", "--data", "{data}", "--label", "state", "--model", "gmm", "-o", "{out}", "--cache",
                       "{O}"], "{data}"),
    ("evaluate --cache", ["evaluate", "--data", "{data}", "--label", "state", "--folds", "2", "--cache", "{O}"],
     "{data}"),
]


def cases_writers(S: Scratch) -> list[Case]:
    from tests.test_writers_safety import CASES

    from wavetrain.data.demo import WORDS as INSTALLED_WORDS

    e = S.env()
    WORDS = S.words
    fmt = {k: str(v) for k, v in e.items()}
    out: list[Case] = []
    quick = {("train", "-o"), ("classify", "--audacity"), ("plot-history", "-o")}
    for (command, option), (template, says) in sorted(CASES.items()):
        argv = [a.format(**fmt) for a in template]
        argv = [str(WORDS.parent) if a == str(INSTALLED_WORDS.parent) else a for a in argv]
        c = S.new("writers", f"{command} {option}: {says}", argv=argv, quick=(command, option) in quick,
                  timeout=120 if "spark" in argv else 60)
        c.allowed = [Path(v) for k, v in zip(argv, argv[1:]) if k in ("-o", "--output") and not Path(v).exists()]
        if command == "demo":
            c.watch_extra = [WORDS.parent]
        out.append(c)
    for name, template, target_t in FILE_WRITERS:
        target = Path(target_t.format(**fmt))
        for k, spelling in enumerate(("absolute", "dot-dot", "dot", "relative", "linked folder", "link to the file",
                                      "hard link")):
            c = S.new("writers", f"{name} at {target.name}, {spelling}", quick=(k == 4 and name == "classify -o"))
            t = _file_spellings(c, target)[spelling]
            c.argv = [a.format(T=t, **fmt) for a in template]
            c.setup = _link_setup(target.parent, target)
            if spelling == "hard link":         # a new name: writing it whole (a rename) leaves the input as it was
                c.expect = (0, 2)
            out.append(c)
    for name, template, folder_t in DIR_WRITERS:
        folder = Path(folder_t.format(**fmt))
        for k, spelling in enumerate(DIR_SPELLINGS):
            c = S.new("writers", f"{name} at {spelling}", quick=(k == 3 and name == "sound cut -o"))
            o = _dir_spellings(c, folder)[spelling]
            if spelling.startswith("a sub-folder") and (folder / "metadata.csv").exists():
                # (the data set is its metadata.csv and the recordings it lists: a new folder beside
                # them holds none of its inputs, as --data d -o d/clips is meant to)
                c.expect, c.allowed = (0, 2), [folder / "sub"]
            c.argv = [a.format(O=o, out=str(c.out), **fmt) for a in template]
            c.setup = _link_setup(folder)
            out.append(c)
    for spelling in ("the folder", "the folder, linked", "a sub-folder"):
        c = S.new("writers", f"demo -o at the shipped words, {spelling}", watch_extra=[WORDS.parent], timeout=180)
        c.argv = ["demo", "-o", _dir_spellings(c, WORDS)[spelling], "--overwrite"]
        c.setup = _link_setup(WORDS)
        out.append(c)
    feats = S.feats()
    out.append(S.new("writers", "features -o at the folder of the index it reads",
                     argv=["features", "--data", str(feats / "index.csv"), "--features", "logmel(bands=8)", "-o",
                           str(feats)]))
    return out


# -- 2. links -----------------------------------------------------------------------------------------
def cases_links(S: Scratch) -> list[Case]:
    e = S.env()
    D, M = str(e["data"]), str(e["models"])
    out: list[Case] = []

    def planted(rel: str, to_folder: bool = False, victim_name: str | None = None):
        """setup: the case's output folder with a link at ``rel`` to a victim file (or folder)."""
        def setup(case: Case) -> None:
            case.out.mkdir(parents=True)
            victim = S.victim(case)
            link = case.out / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(victim.parent if to_folder else victim, target_is_directory=to_folder)
        return setup

    # the demo's shipped audio and its folders
    c = S.new("links", "demo -o a folder that is not empty, without --overwrite", timeout=180)
    c.argv = ["demo", "-o", str(c.out)]

    def not_empty(case: Case) -> None:
        case.out.mkdir(parents=True)
        (case.out / "mine.txt").write_text("mine\n")
    c.setup = not_empty
    out.append(c)
    for rel, to_folder in (("words/seven_en-us_f1_0.flac", False), ("words", True), ("machines", True)):
        c = S.new("links", f"demo -o --overwrite, a link at {rel} to a {'folder' if to_folder else 'file'} elsewhere",
                  timeout=240, quick=rel.endswith(".flac"))
        c.argv = ["demo", "-o", str(c.out), "--overwrite"]
        c.setup = planted(rel, to_folder)
        out.append(c)
    # part and group sub-folders
    for tool, extra, rel in (("partition", ["--parts", "2"], "part1"), ("partition", ["--parts", "2"], "part2"),
                             ("partition", ["--ratio", "0.5"], "test"), ("group", [], "low"),
                             ("group", ["--copy"], "high")):
        c = S.new("links", f"sound {tool} {' '.join(extra)} --overwrite, a link at {rel} to a folder elsewhere",
                  quick=rel == "part1")
        c.argv = ["sound", tool, "--data", D, "--label", "state", *extra, "-o", str(c.out), "--overwrite"]
        c.setup = planted(rel, True)
        out.append(c)
    for tool, argv, rel in (("sound cut", ["sound", "cut", "--data", D, "--clip-ms", "100"], "metadata.csv"),
                            ("features", ["features", "--data", D, "--features", "logmel(bands=8)", "--no-progress"],
                             "index.csv")):
        c = S.new("links", f"{tool} -o --overwrite, a link at {rel} to a file elsewhere", expect=(0, 2))
        c.argv = [*argv, "-o", str(c.out)] + (["--overwrite"] if tool.startswith("sound") else [])
        c.setup = planted(rel)
        out.append(c)
    # an output that is a link
    for what, argv, name in (
            ("train -o", ["train", "--data", D, "--label", "state", "--model", "gmm", "--no-cache"], "m.wt"),
            ("classify -o", ["classify", "-m", f"{M}/m.wt", "--data", D], "p.csv"),
            ("export -o", ["export", "-m", f"{M}/m.wt"], "m.onnx"),
            ("plot -o", ["plot", f"{D}/r0.wav"], "r0.png"),
            ("sound label -o --overwrite", ["sound", "label", "-m", f"{M}/m.wt", "--data", D, "--overwrite"],
             "metadata.csv")):
        c = S.new("links", f"{what} a link to a file elsewhere")
        c.argv = [*argv, "-o", str(c.out / name)]
        c.setup = planted(name)
        out.append(c)
    c = S.new("links", "train -o a dangling link (its target would be created elsewhere)")
    c.argv = ["train", "--data", D, "--label", "state", "--model", "gmm", "--no-cache", "-o", str(c.out / "m.wt")]

    def dangling_out(case: Case) -> None:
        case.out.mkdir(parents=True)
        (case.out / "m.wt").symlink_to(S.victim(case).parent / "created.wt")
    c.setup = dangling_out
    out.append(c)
    # the feature store's CACHEDIR.TAG
    store_users = [
        ("train --cache", ["train", "--data", D, "--label", "state", "--model", "gmm", "-o", "{out}/m.wt", "--cache",
                           "{C}"]),
        ("evaluate --cache", ["evaluate", "--data", D, "--label", "state", "--folds", "2", "--cache", "{C}"]),
        ("classify --cache", ["classify", "-m", f"{M}/m.wt", "--data", D, "--cache", "{C}"]),
        ("sound label --cache", ["sound", "label", "-m", f"{M}/m.wt", "--data", D, "-o", "{out}/l.csv", "--cache",
                                 "{C}"]),
        ("plot roc --cache", ["plot", "roc", "-m", f"{M}/det.wt", "--data", D, "--label", "state", "-o",
                              "{out}/roc.png", "--cache", "{C}"]),
        ("cache info --cache", ["cache", "info", "--cache", "{C}"]),
        ("cache clear --cache", ["cache", "clear", "--cache", "{C}"]),
        ("train, $WAVETRAIN_CACHE", ["train", "--data", D, "--label", "state", "--model", "gmm", "-o",
                                     "{out}/m.wt"]),
    ]
    for dangling in (True, False):
        for what, template in (store_users if dangling else store_users[:1] + store_users[-2:-1]):
            c = S.new("links", f"{what}, CACHEDIR.TAG a {'dangling ' if dangling else ''}link to a file elsewhere",
                      quick=dangling and what == "train --cache")
            store = c.cwd / "store"
            c.argv = [a.format(C=store, out=c.out) for a in template]
            if "$WAVETRAIN_CACHE" in what:
                c.env = {"WAVETRAIN_CACHE": str(store)}
            c.allowed = []

            def tag(case: Case, store=store, dangling=dangling) -> None:
                store.mkdir()
                case.out.mkdir(parents=True, exist_ok=True)
                victim = S.victim(case)
                target = victim.parent / "planted" if dangling else victim
                (store / "CACHEDIR.TAG").symlink_to(target)
            c.setup = tag
            out.append(c)
    for what, folder in (("the data set's folder", e["data"]), ("the models' folder", e["models"]),
                         ("the scratch folder", S.root / "links")):
        out.append(S.new("links", f"cache clear --cache {what} (no feature store)",
                         argv=["cache", "clear", "--cache", str(folder)]))
    # stale temporary files of killed writers
    from wavetrain.core.outputs import HOST

    hexs = "0123456789abcdef"
    for what, argv, name in (
            ("train -o", ["train", "--data", D, "--label", "state", "--model", "gmm", "--no-cache"], "m.wt"),
            ("classify -o", ["classify", "-m", f"{M}/m.wt", "--data", D], "p.csv"),
            ("sound cut -o", ["sound", "cut", "--data", D, "--clip-ms", "100"], "clips"),
            ("export -o", ["export", "-m", f"{M}/m.wt"], "m.onnx")):
        c = S.new("links", f"{what}: stale temporaries of a killed run removed, others' kept", expect=(0,),
                  quick=what == "train -o")
        c.argv = [*argv, "-o", str(c.out / name)]

        def stale(case: Case) -> None:
            dead = subprocess.Popen([sys.executable, "-c", "pass"])
            dead.wait()
            case.out.mkdir(parents=True)
            victim = S.victim(case)
            (case.out / f".m.wt.{HOST}.{dead.pid}.{hexs}.tmp").write_bytes(b"half a model")
            stage = case.out / f".clips.{HOST}.{dead.pid}.{hexs}.tmp"
            (stage / "part1").mkdir(parents=True)
            (stage / "part1" / "metadata.csv").write_text("x.wav\n")
            (case.out / f".b.wav.otherhost.1.{hexs}.tmp").write_bytes(b"keep")      # another machine's, recent
            (case.out / "notes.tmp").write_bytes(b"keep")                             # not of wavetrain's form
            (case.out / f".d.wav.{HOST}.{dead.pid}.{hexs}.tmp").symlink_to(victim)    # a link of that form

        def stale_check(case: Case, res: dict) -> tuple[str, str] | None:
            names = {p.name for p in case.out.iterdir()}
            if any(n.startswith((".m.wt.", ".clips.")) and n.endswith(f"{hexs}.tmp") for n in names):
                return "data-loss", "a stale temporary file of a killed run was left"
            kept = [f".b.wav.otherhost.1.{hexs}.tmp", "notes.tmp"]
            if any(n not in names for n in kept) or not any(n.startswith(".d.wav.") for n in names):
                return "data-loss", "a file that was not its own was removed"
            return None
        c.setup = stale
        c.checks = [stale_check]
        out.append(c)
    # kill -9, then the next write
    for what, argv, name in (
            ("sound cut -o", ["sound", "cut", "--data", D, "--clip-ms", "20", "--overwrite"], "clips"),
            ("train -o", ["train", "--data", D, "--label", "state", "--model", "gmm", "--no-cache"], "m.wt")):
        for delay in (0.5, 0.7, 0.9, 1.2):
            c = S.new("links", f"{what} killed (SIGKILL) after {delay} s, then written again", expect=(0,))
            c.argv = [*argv, "-o", str(c.out / name)]
            c.setup = lambda case: case.out.mkdir(parents=True)
            c.runner = _kill9_runner(delay)
            c.checks = [no_temporaries(c.out)]
            out.append(c)
    return out


def _kill9_runner(delay: float) -> Callable[[Case, Scratch], dict]:
    def run(case: Case, S: Scratch) -> dict:
        env = {**S.child_env, **case.env}
        cmd = _util.wavetrain_cmd() + case.argv
        p = subprocess.Popen(cmd, cwd=case.cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        time.sleep(delay)
        _killpg(p.pid)
        killed_rc = p.wait()
        left = sum(1 for p_ in case.out.rglob("*") if TMP_NAME.match(p_.name))
        res = run_child(cmd, cwd=case.cwd, env=env, stdin=None, timeout=case.timeout, tmp=S.root / "tmp")
        res["note"] = (f"the killed run (exit {killed_rc}) left {left} temporary file(s)" if killed_rc < 0
                       else f"the first run ended (exit {killed_rc}) before the kill")
        return res
    return run


# -- 3. hostile graphs --------------------------------------------------------------------------------
def cases_graphs(S: Scratch) -> list[Case]:
    import tests.models.test_onnx_safety as g

    wav, csv = S.demo_wav(), S.demo_csv()
    loud, quiet = S.tone_wav("loud.wav", 0.6), S.tone_wav("quiet.wav", 0.06)
    folder = S.root / "built" / "hostile-graphs"
    folder.mkdir(parents=True, exist_ok=True)
    out: list[Case] = []

    def edited(name: str, base: str, edit) -> Path:
        path = folder / f"{_slug(name)}.onnx"
        if not path.exists():
            proto = g._proto(S.graph(base))
            edit(proto)
            g._save(proto, path)
        return path

    quick_load = {"label with an escape"}
    for name in (["label with an escape", "scores NaN"] if S.quick else sorted(g.ON_LOAD)):
        base, edit, words = g.ON_LOAD[name]
        out.append(S.new("graphs", f"info: {name}", argv=["info", str(edited(name, base, edit))],
                         quick=name in quick_load))
    for name in ("label with an escape", "labels empty", "label unknown", "input renamed", "output best missing",
                 "best out of range", "scores NaN", "4 TB ConstantOfShape", "score_kind anomaly, no threshold",
                 "detector without threshold"):
        if S.quick and name != "scores NaN":
            continue
        base, edit, _ = g.ON_LOAD[name]
        path = edited(name, base, edit)
        out.append(S.new("graphs", f"classify -m: {name}", argv=["classify", "-m", str(path), str(wav)],
                         checks=[no_nan_answer], quick=True))
        if name in ("label with an escape", "labels empty", "best out of range", "scores NaN", "input renamed",
                    "4 TB ConstantOfShape"):
            out.append(S.new("graphs", f"evaluate -m: {name}",
                             argv=["evaluate", "-m", str(path), "--data", str(csv), "--label", "state"]))
        if name in ("label with an escape", "scores NaN", "4 TB ConstantOfShape"):
            out.append(S.new("graphs", f"serve -m: {name}", argv=["serve", "-m", str(path), "--port", "0"]))
    # data in other files
    secret_dir = folder / "outside"
    secret_dir.mkdir(exist_ok=True)
    secret = secret_dir / "secret.bin"
    if not secret.exists():
        import numpy as np

        secret.write_bytes(np.array([1.5, 2.5, 3.5, 4.5], np.float32).tobytes())
    hows: dict[str, Callable] = {"initializer": g._leak, "constant": g._leak_in_constant, "sparse": g._leak_sparse,
            "loop body": g._leak_in_loop_body}
    for where in ("absolute", "parent", "in the folder", "hard link"):
        for how, edit in hows.items():
            if S.quick and (where, how) != ("absolute", "initializer"):
                continue
            model_dir = folder / _slug(f"ext {where} {how}")
            model_dir.mkdir(exist_ok=True)
            if where == "hard link" and not (model_dir / "weights.bin").exists():
                os.link(secret, model_dir / "weights.bin")
            elif where == "in the folder":
                (model_dir / "weights.bin").write_bytes(secret.read_bytes())
            location = {"absolute": str(secret), "parent": "../outside/secret.bin"}.get(where, "weights.bin")
            path = model_dir / "hostile.onnx"
            if not path.exists():
                proto = g._proto(S.graph("gmm"))
                edit(proto, g._external("leak", location))
                g._save(proto, path)
            out.append(S.new("graphs", f"classify -m: external data ({where}, {how})",
                             argv=["classify", "-m", str(path), str(loud)], quick=True))
    # runs that never end, NaN on some clips, memory
    forever = edited("loop forever", "gmm", lambda p: g._add_to_scores(p, lambda: g._loop(p, "")))
    hang = edited("hang when loud", "gmm", g._hang_when_loud)
    nan = edited("nan when loud", "gmm", g._nan_when_loud)
    short = {"WAVETRAIN_GRAPH_TIMEOUT": "2"}
    if not S.quick:
        out.append(S.new("graphs", "info: a Loop that never ends (the default deadline)", argv=["info", str(forever)],
                         timeout=90))
    out.append(S.new("graphs", "classify -m: a Loop that never ends (deadline 2 s)",
                     argv=["classify", "-m", str(forever), str(wav)], env=short, quick=True))
    out += [S.new("graphs", "evaluate -m: a Loop that never ends (deadline 2 s)",
                  argv=["evaluate", "-m", str(forever), "--data", str(csv), "--label", "state"], env=short),
            S.new("graphs", "serve -m: a Loop that never ends (deadline 2 s)",
                  argv=["serve", "-m", str(forever), "--port", "0"], env=short),
            S.new("graphs", "classify -m: a graph that loops on loud clips, a loud clip (deadline 2 s)",
                  argv=["classify", "-m", str(hang), str(loud)], env=short),
            S.new("graphs", "classify -m: a graph that loops on loud clips, a quiet clip (deadline 2 s)",
                  argv=["classify", "-m", str(hang), str(quiet)], env=short, expect=(0,)),
            S.new("graphs", "classify -m: a graph that loops on loud clips, Ctrl-C after 3 s",
                  argv=["classify", "-m", str(hang), str(loud)], env={"WAVETRAIN_GRAPH_TIMEOUT": "3600"},
                  runner=_sigint_runner(3.0), expect=(130,)),
            S.new("graphs", "classify -m: NaN scores on loud clips", argv=["classify", "-m", str(nan), str(loud)],
                  checks=[no_nan_answer]),
            S.new("graphs", "classify --json -m: NaN scores on loud clips",
                  argv=["classify", "--json", "-m", str(nan), str(loud)], checks=[no_nan_answer])]
    for how, edit in (("one node", lambda p: g._constant_of_shape(p, 300_000_000, 1)),
                      ("three constant nodes", lambda p: g._constant_of_shape(p, 300_000_000, 3)),
                      ("the shape of a static shape", lambda p: g._constant_of_static_shape(p, 300_000_000))):
        path = edited(f"1.2 GB {how}", "gmm", edit)
        out.append(S.new("graphs", f"info: 1.2 GB of zeros asked by {how} (bound 256M)", argv=["info", str(path)],
                         env={"WAVETRAIN_GRAPH_MEMORY": "256M"}, checks=[rss_below(700)]))
    for base in (["gmm"] if S.quick else list(g.MODELS)):
        out.append(S.new("graphs", f"control: info, the exported {base} graph", argv=["info", str(S.graph(base))],
                         expect=(0,)))
        out.append(S.new("graphs", f"control: classify -m, the exported {base} graph",
                         argv=["classify", "-m", str(S.graph(base)), str(wav)], expect=(0,),
                         checks=[no_nan_answer]))
    return out


def _sigint_runner(after: float) -> Callable[[Case, Scratch], dict]:
    """The case's command, SIGINT to its process group ``after`` seconds in."""
    def run(case: Case, S: Scratch) -> dict:
        def interrupt(p: subprocess.Popen) -> None:
            time.sleep(after)
            _killpg(p.pid, signal.SIGINT)
        return _run_with(case, S, interrupt)
    return run


def _run_with(case: Case, S: Scratch, action: Callable[[subprocess.Popen], None]) -> dict:
    """The case's command, ``action(popen)`` in a thread once it started."""
    return run_child(_util.wavetrain_cmd() + case.argv, cwd=case.cwd, env={**S.child_env, **case.env},
                     stdin=None, timeout=case.timeout, tmp=S.root / "tmp", on_start=action)


# -- named pipes and devices -----------------------------------------------------------------------
def cases_fifo(S: Scratch) -> list[Case]:
    from tests.cli.test_fifo_inputs import CASES

    e = S.env()
    base = {"csv": S.demo_csv(), "wav": S.demo_wav(), "model": e["models"] / "m.wt"}
    out: list[Case] = []

    def fifo_at(name: str) -> Callable[[Case], None]:
        def setup(case: Case) -> None:
            os.mkfifo(case.cwd / name)
        return setup

    for key, (name, template) in sorted(CASES.items()):
        c = S.new("fifo", f"{key}: a named pipe {name}", timeout=30, quick=key in ("info-onnx", "train-toml"),
                  out_dir=True)
        c.argv = [a.format(fifo=c.cwd / name, root=c.out, **{k: str(v) for k, v in base.items()}) for a in template]
        c.setup = fifo_at(name)
        out.append(c)
    D, M = str(e["data"]), str(e["models"])
    extras = [
        ("serve -m", "model.wt", ["serve", "-m", "{fifo}", "--port", "0"]),
        ("export -m", "model.wt", ["export", "-m", "{fifo}", "-o", "{out}/m.onnx"]),
        ("plot", "sound.wav", ["plot", "{fifo}", "-o", "{out}/p.png"]),
        ("features --data", "sound.wav", ["features", "--data", "{fifo}", "--features", "logmel(bands=8)", "-o",
                                          "{out}"]),
        ("sound cut --data", "sound.wav", ["sound", "cut", "--data", "{fifo}", "--clip-ms", "100", "-o", "{out}"]),
        ("evaluate --data", "metadata.csv", ["evaluate", "--data", "{fifo}", "--label", "state"]),
        ("train --data", "metadata.csv", ["train", "--data", "{fifo}", "--label", "state", "--model", "gmm",
                                          "-o", "{out}/m.wt"]),
        ("sound splice --data", "metadata.csv", ["sound", "splice", "--data", "{fifo}", "-o", "{out}/s.wav"]),
    ]
    for what, name, template in extras:
        c = S.new("fifo", f"{what}: a named pipe {name}", timeout=30, out_dir=True)
        c.argv = [a.format(fifo=c.cwd / name, out=c.out) for a in template]
        c.setup = fifo_at(name)
        out.append(c)
    for what, argv in (("train", ["train", "--label", "state", "--model", "gmm", "-o", "{out}/m.wt"]),
                       ("classify", ["classify", "-m", f"{M}/m.wt"])):
        c = S.new("fifo", f"{what} --data: a data set whose metadata lists a named pipe", timeout=30, out_dir=True)
        c.argv = [a.format(out=c.out) for a in argv] + ["--data", str(c.cwd / "set")]

        def pipe_set(case: Case) -> None:
            (case.cwd / "set").mkdir()
            shutil.copyfile(Path(D) / "r0.wav", case.cwd / "set" / "r0.wav")
            shutil.copyfile(Path(D) / "r1.wav", case.cwd / "set" / "r1.wav")
            os.mkfifo(case.cwd / "set" / "pipe.wav")
            (case.cwd / "set" / "metadata.csv").write_text("r0.wav,state=high\nr1.wav,state=low\n"
                                                          "pipe.wav,state=low\n")
        c.setup = pipe_set
        out.append(c)
    out += [S.new("fifo", "classify: /dev/zero as a recording", argv=["classify", "-m", f"{M}/m.wt", "/dev/zero"],
                  timeout=30),
            S.new("fifo", "info: /dev/zero", argv=["info", "/dev/zero"], timeout=30)]
    for what, make in (("a named pipe checkpoint.pt", lambda d: os.mkfifo(d / "checkpoint.pt")),
                       ("a plain file for the folder", None)):
        c = S.new("fifo", f"train --resume: {what}", timeout=60, out_dir=True)
        resume = c.cwd / ("ck" if make else "plain-file")
        c.argv = ["train", "--data", str(S.demo_csv()), "--label", "state", "--model", "cnn", "--features",
                  "logmel(bands=8)", "--set", "epochs=1", "--set", "batch_size=8", "--resume", str(resume), "-o",
                  str(c.out / "m.wt")]

        def ck(case: Case, resume=resume, make=make) -> None:
            if make:
                resume.mkdir()
                make(resume)
            else:
                resume.write_bytes(b"x")
        c.setup = ck
        c.checks = [no_partial(c.out / "m.wt")]
        out.append(c)
    return out


# -- 4. model files -----------------------------------------------------------------------------------
def cases_modelfiles(S: Scratch) -> list[Case]:
    import zipfile

    import numpy as np
    import tests.models.test_modelfile_safety as mf

    from wavetrain.models import save_model

    wav = S.demo_wav()
    folder = S.root / "built" / "model-files"
    folder.mkdir(parents=True, exist_ok=True)
    out: list[Case] = []
    #: family -> which of its arrays to mutate (every mutation of the metadata for gmm; the labels'
    #: for the others)
    plan = {"gmm": ("means", "score_sd"), "normal-dist": ("threshold",), "knn": ("vector_labels",)}
    saved = {}
    for fam, arrays in plan.items():
        model, _ = mf._fit(fam)
        path = save_model(model, folder / f"{fam}.wt")
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["__meta__"].tobytes().decode())
            weights = {k[2:]: z[k] for k in z.files if k.startswith("w/")}
        saved[fam] = (path, meta, weights)
        if S.quick:
            continue
        for what, mutate in mf._mutations(meta, weights):
            key = what.split(":")[0]
            if not (key in arrays or (fam == "gmm" and key not in weights) or (fam != "knn" and key == "labels")):
                continue
            m, w = json.loads(json.dumps(meta)), {k: v.copy() for k, v in weights.items()}
            try:
                mutate(m, w)
            except (ValueError, TypeError, IndexError):
                continue                    # the mutation does not apply to this array
            target = folder / f"{fam}-{_slug(what)}.wt"
            mf._write(target, m, w)
            out.append(S.new("model-files", f"{fam}, {what}", argv=["classify", "-m", str(target), str(wav)],
                             expect=(0, 2), checks=[no_nan_answer]))

    def named(fam: str, what: str, mutate) -> Path:
        path, meta, weights = saved[fam]
        m, w = json.loads(json.dumps(meta)), dict(weights)
        mutate(m, w)
        target = folder / f"named-{fam}-{_slug(what)}.wt"
        mf._write(target, m, w)
        return target

    gmm_meta, gmm_w = saved["gmm"][1], saved["gmm"][2]
    muts = dict(mf._mutations(gmm_meta, gmm_w))
    t, mean, sd = (float(v) for v in saved["normal-dist"][2]["threshold"])

    def set_threshold(values):
        def apply(m, w):
            w["threshold"] = np.array(values)
        return apply

    def set_label_unknown(m, w):
        m["labels"] = ["unknown"] + m["labels"][1:]

    files = {
        "gmm, the label value unknown": (named("gmm", "unknown", set_label_unknown), (2,)),
        "gmm, weights times 1e20": (named("gmm", "1e20", muts["weights: all times 1e20"]), (2,)),
        "gmm, a terminal escape in a label": (named("gmm", "escape", muts["labels: a terminal escape"]), (2,)),
        "gmm, an extra array": (named("gmm", "extra", muts["weights: an extra array"]), (2,)),
        "gmm, clip_ms=1e15": (named("gmm", "clip", muts["params: clip_ms=1e15"]), (2,)),
        "gmm, score_sd all zeros": (named("gmm", "sd0", muts["score_sd: zeros"]), (0, 2)),
        "normal-dist, score sd 0 and threshold above the mean": (
            named("normal-dist", "sd0-off", set_threshold([t + 1.0, t, 0.0])), (2,)),
        "normal-dist, score sd 0 and threshold at the mean": (
            named("normal-dist", "sd0-at", set_threshold([t, t, 0.0])), (0,)),
        "normal-dist, score sd negative": (named("normal-dist", "sd-neg", set_threshold([t, mean, -abs(sd) - 1])),
                                           (2,)),
        "normal-dist, its normal value named unknown": (named("normal-dist", "unknown", set_label_unknown), (0,)),
    }
    bomb = folder / "gmm-800-members-of-zeros.wt"
    zeros = mf._npy_bytes(np.zeros(1 << 17))
    with zipfile.ZipFile(saved["gmm"][0]) as z, zipfile.ZipFile(bomb, "w") as zout:
        for info in z.infolist():
            zout.writestr(info, z.read(info))
        for i in range(800):
            zout.writestr(f"w/extra{i}.npy", zeros, compress_type=zipfile.ZIP_DEFLATED)
    files["gmm, 800 extra members of 1 MB of zeros"] = (bomb, (2,))
    for what, content in (("a Python pickle", b"\x80\x04\x95" + bytes(20)), ("an empty file", b""),
                          ("a numpy array", b"\x93NUMPY" + bytes(20)), ("not a zip", b"hello world")):
        p = folder / f"{_slug(what)}.wt"
        p.write_bytes(content)
        files[what] = (p, (2,))
    big = folder / "zip-bomb.wt"
    mf._zip(big, {"w/x.npy": mf._npy_bytes(np.zeros(4_000_000))}, compression=zipfile.ZIP_DEFLATED)
    files["a member that unpacks 2,000 times its size"] = (big, (2,))
    quick = {"gmm, 800 extra members of 1 MB of zeros", "gmm, weights times 1e20", "gmm, the label value unknown"}
    for what, (path, expect) in files.items():
        for cmd in (["info", str(path)], ["classify", "-m", str(path), str(wav)]):
            if S.quick and (what not in quick or cmd[0] != "info"):
                continue
            checks: list[Check] = [no_nan_answer] if cmd[0] == "classify" else []
            if "800" in what:
                checks.append(rss_below(400))
            out.append(S.new("model-files", f"{cmd[0]}: {what}", argv=cmd, expect=expect, checks=checks,
                             quick=what in quick))
    if not S.quick:
        out += [S.new("model-files", "serve -m: 800 extra members of zeros",
                      argv=["serve", "-m", str(bomb), "--port", "0"], checks=[rss_below(400)]),
                S.new("model-files", "evaluate -m: weights times 1e20",
                      argv=["evaluate", "-m", str(files["gmm, weights times 1e20"][0]), "--data",
                            str(S.env()["data"]), "--label", "state"])]
    return out


# -- 5. the server ------------------------------------------------------------------------------------
class Server:
    """``wavetrain serve`` in its own process on 127.0.0.1, started by its first case, its log kept."""

    def __init__(self, S: Scratch, model: Path, extra: list[str], env: dict | None = None):
        self.S, self.model, self.extra, self.env = S, model, extra, env or {}
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log: list[str] = []
        self.lock = threading.Lock()
        self.failed: str | None = None

    def ensure(self) -> bool:
        if self.proc is not None or self.failed:
            return self.failed is None
        self.port = _free_port()
        cmd = _util.wavetrain_cmd() + ["serve", "-m", str(self.model), "--port", str(self.port), *self.extra]
        self.proc = subprocess.Popen(cmd, env={**self.S.child_env, **self.env}, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
                                     cwd=self.S.root / "tmp")
        threading.Thread(target=self._read, daemon=True).start()
        self.S.cleanups.append(self.kill)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                status, _, _ = http(self.port, _request("GET", "/healthz", self.port), 5)
                if status == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.2)
        self.failed = "wavetrain serve did not start: " + " | ".join(self.log[-5:])
        return False

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.lock:
                self.log.append(line.rstrip("\n"))

    def mark(self) -> int:
        with self.lock:
            return len(self.log)

    def since(self, mark: int) -> str:
        time.sleep(0.2)                     # (a traceback logged just after the answer)
        with self.lock:
            return "\n".join(self.log[mark:])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _killpg(self.proc.pid)
            self.proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(method: str, path: str, port: int, headers: dict[str, str] | None = None, body: bytes = b"",
             length: bool = True) -> bytes:
    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    for k, v in (headers or {}).items():
        head.append(f"{k}: {v}")
    if length and (body or method == "POST") and not any(k.lower() == "content-length" for k in (headers or {})):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def http(port: int, data: bytes | Callable[[socket.socket], None], timeout: float) -> tuple[int, dict, bytes]:
    """Send ``data`` (or let it send), read the answer; ``(0, {}, b"")`` when the server closed the
    connection without one. ``TimeoutError`` when nothing ends within ``timeout``."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    deadline = time.monotonic() + timeout
    try:
        try:
            if callable(data):
                data(s)
            else:
                s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        buf = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            s.settimeout(left)
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            head, sep, body = buf.partition(b"\r\n\r\n")
            if sep:
                m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if m and len(body) >= int(m.group(1)):
                    break
    finally:
        s.close()
    if not buf:
        return 0, {}, b""
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _http_runner(srv: Server, make: Callable[[int], bytes | Callable[[socket.socket], None]],
                 check_headers: Callable[[dict, bytes], str | None] | None = None) -> Callable[[Case, Scratch], dict]:
    def run(case: Case, S: Scratch) -> dict:
        if not srv.ensure():
            return {"rc": -1, "http": True, "seconds": 0.0, "stderr": srv.failed or "", "timed_out": False,
                    "problems": [("unexpected", srv.failed or "no server")]}
        mark = srv.mark()
        t0 = time.perf_counter()
        problems = []
        try:
            status, headers, body = http(srv.port, make(srv.port), case.timeout)
            timed_out = False
        except TimeoutError:
            status, headers, body, timed_out = -1, {}, b"", True
        wall = time.perf_counter() - t0
        if check_headers and not timed_out:
            found = check_headers(headers, body)
            if found:
                problems.append(("unexpected", found))
        return {"rc": status, "http": True, "seconds": round(wall, 2), "stderr": srv.since(mark),
                "stdout": body.decode(errors="replace")[:2000], "timed_out": timed_out, "problems": problems}
    return run


def _stop_runner(srv: Server, sig: int = signal.SIGINT) -> Callable[[Case, Scratch], dict]:
    def run(case: Case, S: Scratch) -> dict:
        if not srv.ensure() or srv.proc is None:
            return {"rc": -1, "seconds": 0.0, "stderr": srv.failed or "", "timed_out": False,
                    "problems": [("unexpected", srv.failed or "no server")]}
        mark = srv.mark()
        t0 = time.perf_counter()
        os.kill(srv.proc.pid, sig)
        try:
            rc = srv.proc.wait(case.timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            srv.kill()
            rc, timed_out = srv.proc.returncode, True
        wall = time.perf_counter() - t0
        time.sleep(0.2)
        log = srv.since(mark)
        # (the server's own start-up and request lines are not an error message)
        return {"rc": rc, "seconds": round(wall, 2), "stderr": log if ("Traceback" in log or rc) else "",
                "timed_out": timed_out}
    return run


def _multipart(data: bytes, boundary: str) -> tuple[bytes, str]:
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            f"Content-Type: audio/wav\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def _trickle(port: int, body: bytes, rate: int, ctype: str = "audio/wav") -> Callable[[socket.socket], None]:
    """Headers at once, then the body at ``rate`` bytes/s until the server answers or closes."""
    def send(s: socket.socket) -> None:
        s.sendall(_request("POST", "/v1/classify", port, {"Content-Type": ctype, "Content-Length": str(len(body))}))
        step = max(1, rate // 10)
        for i in range(0, len(body), step):
            readable, _, _ = select.select([s], [], [], 0)
            if readable:
                return
            s.sendall(body[i:i + step])
            time.sleep(0.1)
    return send


def _no_cors(headers: dict, body: bytes) -> str | None:
    allow = [k for k in headers if k.startswith("access-control-allow")]
    return f"CORS headers in the answer: {allow}" if allow else None


def _no_passwd(headers: dict, body: bytes) -> str | None:
    return "a file of the machine in the answer" if b"root:" in body else None


def cases_server(S: Scratch) -> list[Case]:
    import numpy as np
    from tests.cli.test_live import _wav_stream_header

    e = S.env()
    wav = (e["data"] / "r0.wav").read_bytes()
    srv = Server(S, e["models"] / "m.wt", ["--timeout", "2", "--max-upload-time", "5", "--max-bytes", "1M"])
    out: list[Case] = []

    def case(name: str, make, expect: tuple[int, ...], quick: bool = False, timeout: float = 30, check=None):
        c = S.new("server", name, expect=expect, timeout=timeout, quick=quick, runner=_http_runner(srv, make, check))
        c.argv = [name]
        out.append(c)

    def post(path: str = "/v1/classify", body: bytes = wav, ctype: str = "audio/wav", **headers: str):
        return lambda port: _request("POST", path, port, {"Content-Type": ctype, **headers}, body)

    def mp(boundary: str):
        body, ctype = _multipart(wav, boundary)
        return post(body=body, ctype=ctype)

    pad = "x" * 1000
    case("control: a wav body", post(), (200,), quick=True)
    case("control: a multipart upload, boundary of 70 characters", mp("b" * 70), (200,))
    case("a multipart boundary of 71 characters", mp("b" * 71), (400,))
    case("a multipart boundary of 300 characters", mp("b" * 300), (400,), quick=True)
    case("a multipart boundary of 10,000 characters", mp("b" * 10_000), (400,))
    case("a multipart boundary with a space at its end (quoted)", lambda port: _request(
        "POST", "/v1/classify", port, {"Content-Type": 'multipart/form-data; boundary="abc "'},
        _multipart(wav, "abc ")[0]), (400,))
    case("an empty multipart boundary", mp(""), (400,))
    part = b"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n\r\n"
    parts = part * 20_000 + b"--b--\r\n"
    case("20,000 empty multipart parts", post(body=parts, ctype="multipart/form-data; boundary=b"), (400,))
    for smooth, want in (("10000", (400,)), ("1000", (200,)), ("0", (400,)), ("-1", (400,)), ("abc", (400,)),
                         ("1e3", (400,))):
        case(f"smooth={smooth}", post(f"/v1/classify?smooth={smooth}"), want, quick=smooth == "10000")
    case("?clip_shift_ms=0 (windows one after another)", post("/v1/classify?clip_shift_ms=0"), (200,))
    for query in ("clip_ms=1000000000000", "clip_shift_ms=-1", "top_k=-1", "unknown=%1b%5b2J", "hold=-5",
                  "nosuch=1"):
        case(f"?{query}", post(f"/v1/classify?{query}"), (400, 422))
    for kib, want in ((15, (200,)), (20, (431,)), (64, (431,))):
        extra = {f"X-Pad-{i}": pad for i in range(kib)}
        case(f"a request head of {kib} KiB, whole",
             lambda port, extra=extra: _request("GET", "/healthz", port, extra), want, quick=kib == 20)
    big = {f"X-Pad-{i}": pad for i in range(20)}

    def pieces(port: int) -> Callable[[socket.socket], None]:
        data = _request("GET", "/healthz", port, big)

        def send(s: socket.socket) -> None:
            for i in range(0, len(data), 1024):
                s.sendall(data[i:i + 1024])
                time.sleep(0.01)
        return send
    case("a request head of 20 KiB in pieces of 1 KiB", pieces, (431, 0))
    case("a foreign Origin", post(Origin="https://evil.example"), (403,), quick=True)
    case("Origin null", post(Origin="null"), (403,))
    case("control: the server's own Origin", lambda port: _request(
        "POST", "/v1/classify", port, {"Content-Type": "audio/wav", "Origin": f"http://127.0.0.1:{port}"}, wav),
         (200,))
    case("a CORS preflight from another site", lambda port: _request("OPTIONS", "/v1/classify", port, {
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"}), (403, 204), quick=True, check=_no_cors)
    case("a CORS preflight without an Origin", lambda port: _request("OPTIONS", "/v1/classify", port, {
        "Access-Control-Request-Method": "POST"}), (204,), check=_no_cors)
    case("a foreign Host", lambda port: _request("POST", "/v1/classify", port, {"Content-Type": "audio/wav"},
                                                 wav).replace(f"Host: 127.0.0.1:{port}".encode(),
                                                              b"Host: evil.example"), (421,))
    case("an upload that stops after its headers (--timeout 2)",
         lambda port: _request("POST", "/v1/classify", port, {"Content-Type": "audio/wav",
                                                              "Content-Length": "30000"}), (408,))
    slow_body = wav + bytes(100_000 - len(wav))
    case("a slow upload: 100 kB at 2 kB/s", lambda port: _trickle(port, slow_body, 2000), (408,))
    case("a body over --max-bytes (Content-Length 2 MB)",
         lambda port: _request("POST", "/v1/classify", port, {"Content-Type": "audio/wav",
                                                              "Content-Length": "2000000"}), (413,))
    case("Content-Length -1", lambda port: _request("POST", "/v1/classify", port, {"Content-Type": "audio/wav",
                                                                                   "Content-Length": "-1"}), (400, 0))
    case("Content-Length not a number", lambda port: _request(
        "POST", "/v1/classify", port, {"Content-Type": "audio/wav", "Content-Length": "lots"}), (400, 0))
    case("two different Content-Lengths", lambda port: _request(
        "POST", "/v1/classify", port, {"Content-Type": "audio/wav", "Content-Length": "10",
                                       "Content-length": "20"}, wav[:10]), (400, 0))
    case("a chunked body with a bad chunk size", lambda port: _request(
        "POST", "/v1/classify", port, {"Content-Type": "audio/wav", "Transfer-Encoding": "chunked"},
        b"zz\r\nabc\r\n0\r\n\r\n", length=False), (400, 0))
    case("a request line of garbage", lambda port: b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(100),
         (400, 0))
    case("a path out of the root", lambda port: _request("GET", "/../../../../etc/passwd", port), (404, 400),
         check=_no_passwd)
    pcm = (0.1 * np.sin(np.arange(8000) / 3)).astype("<f4").tobytes()
    nan_pcm = np.where(np.arange(8000) == 4000, np.nan, 0.1).astype("<f4").tobytes()
    for name, query, body in (("sample_rate 5 MHz", "sample_rate=5000000&channels=1&format=f32le", pcm),
                              ("sample_rate 0", "sample_rate=0&channels=1&format=f32le", pcm),
                              ("100,000 channels", "sample_rate=16000&channels=100000&format=f32le", pcm),
                              ("format s99le", "sample_rate=16000&channels=1&format=s99le", pcm),
                              ("a NaN sample", "sample_rate=16000&channels=1&format=f32le", nan_pcm)):
        case(f"raw PCM, {name}", post(f"/v1/classify?{query}", body=body, ctype="application/octet-stream"),
             (400, 422))
    case("a wav whose header says 5 MHz", post(body=_wav_stream_header(5_000_000, data_size=2000) + bytes(2000)),
         (400, 422))
    case("a wav whose header says 0 channels", post(body=_wav_stream_header(16000, channels=0, data_size=2000)
                                                   + bytes(2000)), (400, 422))
    stop = S.new("server", "SIGINT: the server stops", expect=(0, 130), timeout=20, runner=_stop_runner(srv),
                 quick=True)
    stop.argv = ["kill -INT <serve>"]
    out.append(stop)
    if not S.quick:                 # a graph that fails on some requests behind the server
        import tests.models.test_onnx_safety as g

        loud = S.tone_wav("loud.wav", 0.6).read_bytes()
        quiet = S.tone_wav("quiet.wav", 0.06).read_bytes()
        for what, edit in (("a graph that loops on loud clips (deadline 2 s)", g._hang_when_loud),
                           ("a graph with NaN scores on loud clips", g._nan_when_loud)):
            path = S.root / "built" / f"serve-{_slug(what)}.onnx"
            proto = g._proto(S.graph("gmm"))
            edit(proto)
            g._save(proto, path)
            gsrv = Server(S, path, ["--timeout", "2"], env={"WAVETRAIN_GRAPH_TIMEOUT": "2"})
            for clip, body, want in (("a loud clip", loud, (500,)), ("a quiet clip", quiet, (200,)),
                                     ("a loud clip again", loud, (500,))):
                c = S.new("server", f"{what}: {clip}", expect=want, timeout=60,
                          runner=_http_runner(gsrv, post(body=body)))
                c.argv = [f"{what}: POST {clip}"]
                out.append(c)
            c = S.new("server", f"{what}: SIGINT stops the server", expect=(0, 130), timeout=20,
                      runner=_stop_runner(gsrv))
            c.argv = ["kill -INT <serve>"]
            out.append(c)
    return out


# -- 6. Spark -----------------------------------------------------------------------------------------
def _java_under(pid: int) -> list:
    import psutil

    try:
        return [c for c in psutil.Process(pid).children(recursive=True)
                if "java" in c.name() and any(a.startswith("org.apache.spark") for a in c.cmdline())]
    except psutil.Error:
        return []


def _spark_sigint_runner(case: Case, S: Scratch) -> dict:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) as soon as Spark's JVM runs."""
    seen: dict[int, object] = {}

    def interrupt(p: subprocess.Popen) -> None:
        deadline = time.monotonic() + 90
        while p.poll() is None and time.monotonic() < deadline:
            java = _java_under(p.pid)
            if java:
                for j in java:
                    seen[j.pid] = j
                time.sleep(0.3)
                _killpg(p.pid, signal.SIGINT)
                return
            time.sleep(0.05)

    res = _run_with(case, S, interrupt)
    time.sleep(3)
    left = [pid for pid, proc in seen.items() if proc.is_running() and proc.status() != "zombie"]  # type: ignore
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    problems = [("unexpected", f"Spark's JVM left running: {left}")] if left else []
    if not seen:
        problems.append(("unexpected", "no JVM was seen before the command ended"))
    res["problems"] = problems
    return res


def cases_spark(S: Scratch) -> list[Case]:
    csv = str(S.demo_csv())
    local = ["--spark-conf", f"spark.local.dir={S.root / 'tmp'}"]
    out: list[Case] = []
    for what, argv in (
            ("train", ["train", "--data", csv, "--label", "state", "--model", "gmm", "-o", "{out}/m.wt", "--table",
                       "{out}/table"]),
            ("evaluate", ["evaluate", "--data", csv, "--label", "state", "--folds", "2", "--table", "{out}/table"]),
            ("features", ["features", "--data", csv, "--features", "logmel(bands=8)", "-o", "{out}/f"])):
        c = S.new("spark", f"{what} --master spark://127.0.0.1:1 (nothing listens)", timeout=60,
                  quick=what == "train", out_dir=True)
        c.argv = [a.format(out=c.out) for a in argv] + ["--engine", "spark", "--master", "spark://127.0.0.1:1",
                                                        "--no-progress", *local]
        out.append(c)
    if not S.quick:
        c = S.new("spark", "train --master local[2]: Ctrl-C while the JVM starts", expect=(130,), timeout=120,
                  runner=_spark_sigint_runner, out_dir=True)
        c.argv = ["train", "--data", csv, "--label", "state", "--model", "gmm", "-o", str(c.out / "m.wt"), "--table",
                  str(c.out / "table"), "--engine", "spark", "--master", "local[2]", "--no-progress", *local]
        out.append(c)
        c = S.new("spark", "train --master local[2] --spark-conf spark.memory.fraction=7", timeout=180,
                  out_dir=True)
        c.argv = ["train", "--data", csv, "--label", "state", "--model", "gmm", "-o", str(c.out / "m.wt"), "--table",
                  str(c.out / "table"), "--engine", "spark", "--master", "local[2]", "--no-progress", *local,
                  "--spark-conf", "spark.memory.fraction=7"]
        out.append(c)
    return out


# -- 7. smaller: scikit-learn, live stdin, full disk ------------------------------------------------
SK_PRELUDE = """\
import sys
import numpy as np
from wavetrain.core.errors import UserError
from wavetrain.sklearn import SoundAnomalyDetector, SoundClassifier

def clips(n=8, rate=16000):
    t = np.arange(rate // 2) / rate
    X = [(0.3 * np.sin(2 * np.pi * (300 if i % 2 else 2000) * t)
          + 0.01 * np.random.default_rng(i).normal(size=t.size)).astype(np.float32) for i in range(n)]
    return X, ["low" if i % 2 else "high" for i in range(n)]

try:
{body}
except (ValueError, UserError) as e:
    print(f"{{type(e).__name__}}: {{e}}", file=sys.stderr)
    sys.exit(2)
"""


def _sk(body: str) -> str:
    return SK_PRELUDE.format(body="\n".join("    " + ln for ln in body.strip().splitlines()))


def cases_sklearn(S: Scratch) -> list[Case]:
    fit = "X, y = clips()\nclf = SoundClassifier(components=2).fit(X, y)\n"
    snippets = [
        ("SoundClassifier(rate=10**12)", "SoundClassifier(rate=10**12)", (2,), True),
        ("SoundClassifier(rate=-16000)", "SoundClassifier(rate=-16000)", (2,), False),
        ("SoundClassifier(rate=16000.5)", "SoundClassifier(rate=16000.5)", (2,), False),
        ("SoundAnomalyDetector(rate=10**12)", "SoundAnomalyDetector(rate=10**12)", (2,), False),
        ("int16 samples scaled as soundfile reads them",
         fit + "pcm = [np.round(np.clip(x, -1, 1 - 2**-15) * 32768).astype(np.int16) for x in X]\n"
               "a, b = clf.predict_proba(pcm), clf.predict_proba([p.astype(np.float32) / 32768 for p in pcm])\n"
               "if not np.allclose(a, b, atol=1e-6):\n"
               "    print('int16 samples not scaled like soundfile', file=sys.stderr); sys.exit(2)", (0,), False),
        ("uint16 samples", fit + "clf.predict([np.zeros(8000, np.uint16)])", (2,), False),
        ("bool samples", fit + "clf.predict([np.zeros(8000, bool)])", (2,), False),
        ("complex samples", fit + "clf.predict([np.zeros(8000, np.complex64)])", (2,), False),
        ("int64 samples at the extremes", fit + "clf.predict([np.full(8000, np.iinfo(np.int64).max)])", (0, 2), False),
        ("samples of strings", fit + "clf.predict([np.array(['a'] * 8000)])", (2,), False),
        ("a NaN sample", fit + "x = X[0].copy(); x[100] = np.nan\nclf.predict([x])", (2,), False),
        ("an infinite sample", fit + "x = X[0].copy(); x[100] = np.inf\nclf.predict([x])", (2,), False),
        ("a 3-D array", fit + "clf.predict(np.zeros((2, 2, 8000), np.float32))", (2,), False),
        ("fit on two clips of 3 samples", "SoundClassifier().fit([np.zeros(3, np.float32)] * 2, ['a', 'b'])", (2,),
         False),
        ("a path that is a named pipe", "import os\nos.mkfifo('pipe.wav')\n" + fit + "clf.predict(['pipe.wav'])",
         (2,), False),
        ("load a model file of 800 members of zeros",
         "SoundClassifier.load(sys.argv[1] if len(sys.argv) > 1 else 'x.wt')", (2,), False),
    ]
    out: list[Case] = []
    bomb = S.root / "built" / "model-files" / "gmm-800-members-of-zeros.wt"
    for name, body, expect, quick in snippets:
        if S.quick and not quick:
            continue
        if "800 members" in name:
            if not bomb.exists():
                continue
            body = f"SoundClassifier.load({str(bomb)!r})"
        out.append(S.new("sklearn", name, python=_sk(body), expect=expect, timeout=90, quick=quick,
                         argv=["python", "-c", f"<the estimators, one-line errors as exit 2> {body}"]))
    return out


def cases_live(S: Scratch) -> list[Case]:
    import numpy as np
    from tests.cli.test_live import _wav_stream_header as H

    model = str(S.clip_model())
    tone = (0.3 * np.sin(np.arange(40000) / 5) * 32767).astype("<i2").tobytes()
    adpcm = b"RIFF\xff\xff\xff\xffWAVEfmt \x10\0\0\0\x02\0\x01\0\x80>\0\0\0}\0\0\x02\0\x10\0data\0\0\0\0"
    table = [
        ("no audio", [], b"", (2,)),
        ("--clip-ms 0", ["--clip-ms", "0"], b"\0\0" * 100, (2,)),
        ("--rate 0", ["--rate", "0"], b"\0\0", (2,)),
        ("a wav of format 2", [], adpcm, (2,)),
        ("a wav header without data", [], H(16000), (2,)),
        ("one byte", [], b"\x01", (2,)),
        ("f32le with a NaN sample", ["--format", "f32le"],
         np.where(np.arange(40000) == 20000, np.nan, 0.01).astype("<f4").tobytes(), (2,)),
        ("f32le, 2 channels, -inf in the second", ["--format", "f32le", "--channels", "2"],
         np.where(np.arange(400) == 247, -np.inf, 0.0).astype("<f4").tobytes(), (2,)),
        ("--rate 1", ["--rate", "1"], b"\0\0" * 100, (2,)),
        ("--rate 5000000", ["--rate", "5000000"], b"\0\0" * 100, (2,)),
        ("--channels 100000", ["--channels", "100000"], b"\0\0" * 100, (2,)),
        ("a wav stream at 800 Hz", [], H(800) + b"\0\0" * 1000, (2,)),
        ("--clip-ms 1000000000", ["--clip-ms", "1000000000"], b"\0\0" * 100, (2,)),
        ("--clip-shift-ms 700000", ["--clip-shift-ms", "700000"], b"\0\0" * 100, (2,)),
        ("a wav stream header of 5 MHz", [], H(5_000_000) + b"\0\0" * 100, (2,)),
        ("a wav stream header of 100 channels", [], H(16000, channels=100) + b"\0\0" * 100, (2,)),
        ("a wav stream header of 0 channels", [], H(16000, channels=0) + b"\0\0" * 100, (2,)),
        ("a wav stream header of 0 bits", [], H(16000, bits=0) + b"\0\0" * 100, (2,)),
        ("control: 2.5 s of s16le", [], tone, (0,)),
        ("a truncated wav stream", [], H(16000, data_size=len(tone) + 32000) + tone, (0,)),
    ]
    out = []
    for name, args, data, expect in table:
        out.append(S.new("live", f"classify -: {name}", argv=["classify", "-m", model, *args, "-"], stdin=data,
                         expect=expect, timeout=60, quick="5 MHz" in name or "1000000000" in name,
                         checks=[no_nan_answer]))

    def never_closed(case: Case, S: Scratch) -> dict:
        return run_child(_util.wavetrain_cmd() + case.argv, cwd=case.cwd, env={**S.child_env, **case.env},
                         stdin=b"", keep_stdin_open=True, timeout=case.timeout, tmp=S.root / "tmp")
    c = S.new("live", "classify -: --clip-ms 1000000000, stdin open and silent (refused at once)", timeout=30,
              runner=never_closed, argv=["classify", "-m", model, "--clip-ms", "1000000000", "-"])
    out.append(c)
    return out


def cases_fulldisk(S: Scratch) -> list[Case]:
    e = S.env()
    D, M = str(e["data"]), str(e["models"])
    mnt = S.root / "full"
    mnt.mkdir(exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mnt)], capture_output=True,
                       text=True)
    if r.returncode:
        S.notes.append(f"full-disk cases skipped: mount -t tmpfs failed: {r.stderr.strip() or r.returncode}")
        return []
    S.mounts.append(mnt)

    def fill(leave: int) -> Callable[[Case], None]:
        def setup(case: Case) -> None:
            for p in mnt.iterdir():
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
            st = os.statvfs(mnt)
            size = max(0, st.f_bavail * st.f_frsize - leave)
            with open(mnt / ".filler", "wb") as f:
                try:
                    f.write(b"\xff" * size)
                except OSError:
                    pass
        return setup

    writers = [
        ("sound cut", ["sound", "cut", "--data", D, "--clip-ms", "100", "-o", "{O}"], "dir"),
        ("sound augment", ["sound", "augment", "--data", D, "--gain=-3:3", "--copies", "3", "-o", "{O}"], "dir"),
        ("sound group --copy", ["sound", "group", "--data", D, "--label", "state", "--copy", "-o", "{O}"], "dir"),
        ("sound partition", ["sound", "partition", "--data", D, "--label", "state", "-o", "{O}"], "dir"),
        ("features", ["features", "--data", D, "--features", "logmel(bands=8)", "-o", "{O}", "--no-progress"],
         "dir"),
        ("train -o", ["train", "--data", D, "--label", "state", "--model", "gmm", "--no-cache", "-o", "{O}.wt"],
         "file"),
        ("train --cache", ["train", "--data", D, "--label", "state", "--model", "gmm", "-o", "{out}/m.wt",
                           "--cache", "{O}"], "cache"),
        ("classify -o", ["classify", "-m", f"{M}/m.wt", "--data", D, "-o", "{O}.csv"], "file"),
        ("export -o", ["export", "-m", f"{M}/m.wt", "-o", "{O}.onnx"], "file"),
        # (the demo's folder is a working folder, written file by file, each file whole: a failed
        # demo leaves what it wrote, and the next `demo -o` there asks for --overwrite)
        ("demo -o", ["demo", "-o", "{O}"], "working folder"),
    ]
    out = []
    for leave in (0, 16 * 1024, 48 * 1024):
        for name, template, what in writers:
            if name == "demo -o" and leave < 48 * 1024:
                continue
            c = S.new("full-disk", f"{name} onto a full disk ({leave // 1024} KiB free)",
                      quick=name == "sound cut" and leave == 16 * 1024, timeout=240 if name == "demo -o" else 60,
                      expect=(2,) if leave == 0 and what != "cache" else (0, 2), out_dir=what == "cache")
            target = mnt / f"o{c.cwd.name}"
            c.argv = [a.format(O=target, out=c.out) for a in template]
            c.allowed = [target, Path(f"{target}.wt"), Path(f"{target}.csv"), Path(f"{target}.onnx"), mnt / ".filler"]
            c.setup = fill(leave)
            c.checks = [no_temporaries(mnt)]
            if what not in ("cache", "working folder"):
                c.checks.append(no_partial(target, Path(f"{target}.wt"), Path(f"{target}.csv"),
                                           Path(f"{target}.onnx")))
            out.append(c)
    return out


GENERATORS: dict[str, Callable[[Scratch], list[Case]]] = {
    "writers": cases_writers, "links": cases_links, "graphs": cases_graphs, "fifo": cases_fifo,
    "model-files": cases_modelfiles, "server": cases_server, "spark": cases_spark, "sklearn": cases_sklearn,
    "live": cases_live, "full-disk": cases_fulldisk,
}


# -- the run ------------------------------------------------------------------------------------------
def _sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def _tally(cases: list[dict]) -> dict[str, dict[str, int]]:
    by: dict[str, dict[str, int]] = {}
    for c in cases:
        t = by.setdefault(c["kind"], {"cases": 0, **{o: 0 for o in OUTCOMES}})
        t["cases"] += 1
        t[c["outcome"]] += 1
    return by


def table(res: dict) -> str:
    by = res["by_kind"]
    rows = [[k, *(by[k][col] for col in ("cases", *OUTCOMES))] for k in KINDS if k in by]
    total = res["totals"]
    rows.append(["**total**", *(f"**{total[col]}**" for col in ("cases", *OUTCOMES))])
    return _util.markdown_table(["kind", "cases", *OUTCOMES], rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a couple of dozen cases (WAVETRAIN_BENCH_QUICK=1 too)")
    ap.add_argument("--only", action="append", choices=KINDS, metavar="KIND", help=f"only this kind: {KINDS}")
    ap.add_argument("--list", action="store_true", help="build the scratch data, list the cases, run none")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (its path is printed)")
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "hostile.json")
    ap.add_argument("--retable", action="store_true", help="only print the table of --out's JSON")
    ap.add_argument("--src", type=Path, help="run the cases against the wavetrain sources in this folder (a "
                                             "'src' of another version; PYTHONPATH of every child)")
    ap.add_argument("--max-timeout", type=float, help="cap every case's timeout at this many seconds")
    args = ap.parse_args(argv)
    if args.retable:
        print(table(json.loads(args.out.read_text())))
        return 0
    quick = _util.quick_mode(args.quick)
    os.environ.update({k: "1" for k in _util.THREAD_VARS})
    os.environ["WAVETRAIN_PROGRESS"] = "0"
    command = " ".join([".venv/bin/python", "benchmarks/bench_hostile.py", *(argv if argv is not None else
                                                                                sys.argv[1:])])
    date_start, load_start = _sh(["date", "-u"]), _sh(["uptime"])
    info = _util.machine_info()
    t_start = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="wt-bench-hostile-"))
    S = Scratch(root, quick, args.src.resolve() if args.src else None, args.max_timeout)
    os.environ["WAVETRAIN_CACHE"] = str(root / "cache")       # (build steps in this process)
    results: list[dict] = []
    build_s: dict[str, float] = {}
    try:
        cases: list[Case] = []
        for kind in args.only or KINDS:
            t = time.perf_counter()
            made = GENERATORS[kind](S)
            cases += [c for c in made if c.quick or not quick]
            build_s[kind] = round(time.perf_counter() - t, 1)
        shutil.copytree(root, S.backup, symlinks=True,
                        ignore=lambda d, names: [n for n in names if Path(d) == root and n in
                                                 ("runs", "out", "cache", "tmp", "full")])
        print(f"scratch folder {root}; {len(cases)} cases (built in {sum(build_s.values()):.0f} s)", flush=True)
        if args.list:
            for c in cases:
                print(f"{c.kind:12} {c.name}")
            return 0
        for i, c in enumerate(cases, 1):
            res = run_case(c, S)
            rec = {"kind": c.kind, "name": c.name,
                   "argv": [str(a).replace(str(root), "$SCRATCH") for a in c.argv],
                   "rc": res.get("rc"), "seconds": res.get("seconds"), "outcome": res["outcome"],
                   "stderr_first_line": _first_line(res.get("stderr", "")).replace(str(root), "$SCRATCH"),
                   "expect": list(c.expect)}
            for k in ("problems", "peak_rss_mb", "note", "changed_outside"):
                if res.get(k):
                    v = res[k]
                    rec[k] = [str(x).replace(str(root), "$SCRATCH") for x in v] if isinstance(v, list) else v
            if c.env:
                rec["env"] = c.env
            results.append(rec)
            flag = "" if rec["outcome"] == "ok" else "  <-- " + "; ".join(rec.get("problems", []))
            print(f"[{i:3}/{len(cases)}] {c.kind:11} {rec['outcome']:10} {rec['seconds'] or 0:6.1f}s  "
                  f"{c.name}{flag}", flush=True)
    finally:
        for fn in S.cleanups:
            fn()
        for mnt in S.mounts:
            subprocess.run(["umount", str(mnt)], capture_output=True)
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(S.backup, ignore_errors=True)
    by = _tally(results)
    totals = {"cases": len(results), **{o: sum(1 for r in results if r["outcome"] == o) for o in OUTCOMES}}
    res = {"benchmark": "hostile", "quick": quick, "command": command, "date_start": date_start,
           "date_end": _sh(["date", "-u"]), "uptime_start": load_start, "uptime_end": _sh(["uptime"]),
           "machine": info, "wall_s": round(time.perf_counter() - t_start, 1), "build_s": build_s,
           "src": str(args.src) if args.src else None, "max_timeout_s": args.max_timeout,
           "notes": S.notes, "by_kind": by, "totals": totals, "cases": results}
    out = _util.quick_out(args.out, "hostile") if quick else args.out
    _util.write_json(out, res)
    print()
    print(table(res))
    for n in S.notes:
        print(f"note: {n}")
    bad = [r for r in results if r["outcome"] != "ok"]
    if bad:
        print("\nnot ok:")
        for r in bad:
            print(f"  {r['kind']}: {r['name']}: {'; '.join(r.get('problems', []))} | {r['stderr_first_line']}")
    print(f"\n{totals['cases']} cases in {res['wall_s']:.0f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
