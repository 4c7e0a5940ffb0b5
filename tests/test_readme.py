"""The manual runs as written: the shell and Python blocks of the README, top to bottom, then those of
docs/*.md, in one fresh folder beside the set-up `make demo` makes (`.venv`, `examples/`), with
nothing else.

A block after a ``<!-- readme-test: slow -->`` line runs only with ``-m slow`` (the whole README
then runs, Spark included); ``<!-- readme-test: skip (why) -->`` marks a block that cannot run here
(the `make` block this test runs in, a command for a Spark cluster).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The manual in the order it runs: the README's first session makes what the docs use.
MANUAL = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!-- readme-test: (slow|skip)\b.*-->\s*$")


@dataclass
class Block:
    language: str
    code: str
    line: int
    mark: str | None        # "slow", "skip" or None


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, each with the mark on the line before it (blank lines
    between allowed)."""
    out: list[Block] = []
    lines = text.splitlines()
    i, mark = 0, None
    while i < len(lines):
        m = MARK.match(lines[i])
        if m:
            mark = m.group(1)
        f = FENCE.match(lines[i])
        if f:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            out.append(Block(f.group(1), "\n".join(lines[i + 1:end]), i + 1, mark))
            i, mark = end + 1, None
            continue
        if lines[i].strip() and not m:
            mark = None
        i += 1
    return out


def script(files: list[Path], folder: Path, slow: bool) -> str:
    """One bash script of the files' blocks in order (Python blocks run from files in ``folder``)."""
    parts = ["set -euo pipefail"]
    for f in files:
        for b in blocks(f.read_text()):
            if b.language not in ("sh", "python") or b.mark == "skip" or (b.mark == "slow" and not slow):
                continue
            where = f"{f.relative_to(ROOT)} line {b.line}"
            parts.append(f"echo '### {where}' >&2")
            if b.language == "sh":
                parts.append(b.code)
            else:
                name = f"block_{f.stem}_{b.line}.py"
                (folder / name).write_text(b.code + "\n")
                parts.append(f"python {name}")
    return "\n".join(parts) + "\n"


def test_the_blocks_are_found_with_their_marks():
    text = ("# t\n```sh\nmake demo\n```\n<!-- readme-test: slow -->\n\n```sh\nspark\n```\ntext\n\n```python\n"
            "print(1)\n```\n<!-- readme-test: skip (why) -->\n```toml\na = 1\n```\n")
    found = blocks(text)
    assert [(b.language, b.code, b.mark) for b in found] == [
        ("sh", "make demo", None), ("sh", "spark", "slow"), ("python", "print(1)", None), ("toml", "a = 1", "skip")]


def test_the_manual_names_no_data_beside_the_repository():
    for f in MANUAL:
        assert "../shared" not in f.read_text() and "shared/data" not in f.read_text(), f
    text = README.read_text()
    assert len(text.splitlines()) <= 350
    first = blocks(text)[0]
    assert first.mark == "skip" and first.code.splitlines()[0].startswith("make demo")


def _run(tmp_path: Path, slow: bool) -> None:
    venv = ROOT / ".venv"
    if not (venv / "bin" / "wavetrain").exists():
        pytest.skip("no .venv with wavetrain (make setup)")
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (.ci/run installs it)")
    os.symlink(venv, tmp_path / ".venv")
    os.symlink(ROOT / "examples", tmp_path / "examples")
    text = script(MANUAL, tmp_path, slow)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", WAVETRAIN_CACHE=str(tmp_path / "cache"),
               WAVETRAIN_PROGRESS="0", MPLBACKEND="Agg")
    done = subprocess.run(["bash", "-c", text], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1800 if slow else 600)
    last = [ln[4:] for ln in done.stderr.splitlines() if ln.startswith("### ")]
    assert done.returncode == 0, (f"the block at {last[-1] if last else '?'} failed:\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    for made in ("demo/machines/metadata.csv", "demo/words/metadata.csv", "machines.wt", "words.wt", "m0.wt",
                 "machines.onnx", "words-cm.png", "roc.png", "long/labels.csv", "clip.pcm"):
        assert (tmp_path / made).is_file(), made


def test_the_manual_runs_as_written(tmp_path):
    _run(tmp_path, slow=False)


@pytest.mark.slow
def test_the_whole_manual_runs_as_written_spark_included(tmp_path):
    _run(tmp_path, slow=True)


if __name__ == "__main__":          # print the script the test runs (its Python blocks go to a temporary folder)
    import tempfile

    sys.stdout.write(script(MANUAL, Path(tempfile.mkdtemp(prefix="wavetrain-manual-")), slow="--slow" in sys.argv))
