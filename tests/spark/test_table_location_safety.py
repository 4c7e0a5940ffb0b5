"""A feature table location that cannot hold a table is refused in one line (exit 2) before
Spark starts: a file, a named pipe, a path under a file, a read-only folder."""
import os
import subprocess

import pytest

from wavetrain.cli.main import main

SPARK = ("--engine", "spark", "--master", "local[2]")


@pytest.fixture(autouse=True)
def no_jvm(monkeypatch):
    """Starting Spark fails the test: every case here must be refused before it."""
    import wavetrain.spark.session as session

    def refuse(settings):
        raise AssertionError("Spark was started for a table location that cannot be used")

    monkeypatch.setattr(session, "spark_session", refuse)


def _read_only(folder):
    """Make ``folder`` read-only even for root (an immutable folder), or skip."""
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip("root here, and chattr cannot make a folder read-only")
    return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)


def _table(tmp_path, kind):
    """A table location of ``kind`` and the function that undoes it."""
    if kind == "file":
        (tmp_path / "t").write_text("not a table")
        return tmp_path / "t", lambda: None
    if kind == "fifo":
        os.mkfifo(tmp_path / "t")
        return tmp_path / "t", lambda: None
    if kind == "under-a-file":
        (tmp_path / "f").write_text("a file")
        return tmp_path / "f" / "table", lambda: None
    undo = _read_only(tmp_path / "ro")
    return tmp_path / "ro" / ("table" if kind == "in-read-only" else ""), undo


@pytest.mark.parametrize("kind, message", [
    ("file", "exists and is not a folder"),
    ("fifo", "exists and is not a folder"),
    ("under-a-file", "is not a folder"),
    ("in-read-only", "cannot write in"),
    ("read-only", "cannot write in"),
])
def test_train_refuses_an_unusable_table_in_one_line(demo_csv, tmp_path, capsys, kind, message):
    table, undo = _table(tmp_path, kind)
    try:
        code = main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm",
                     "-o", str(tmp_path / "m.wt"), "--table", str(table), *SPARK])
    finally:
        undo()
    err = capsys.readouterr().err
    assert code == 2 and f"--table {table}" in err and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "m.wt").exists()


def test_a_spec_folder_that_cannot_be_written_is_one_user_error_in_the_task(tmp_path):
    import numpy as np

    from wavetrain.core.errors import UserError
    from wavetrain.spark.table import FeatureTable

    table = FeatureTable(str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    folder = table.folder("logmel(bands=4)")
    undo = _read_only(tmp_path / "t" / os.path.basename(folder))
    try:
        with pytest.raises(UserError, match=r"cannot write in .*spec=.*; give a writable table location$"):
            table.write_part("logmel(bands=4)", iter([("a", np.zeros((3, 4), np.float32), 16000, 0.01, 30)]), ["a"])
    finally:
        undo()
    assert os.listdir(folder) == []


@pytest.mark.parametrize("command", ["evaluate", "classify", "features"])
def test_every_spark_command_checks_the_table_first(demo_csv, tmp_path, capsys, command):
    (tmp_path / "t").write_text("not a table")
    argv = {
        "evaluate": ["evaluate", "--data", str(demo_csv), "--label", "state", "--folds", "2",
                     "--table", str(tmp_path / "t")],
        "classify": ["classify", "-m", str(tmp_path / "m.wt"), "--data", str(demo_csv),
                     "-o", str(tmp_path / "p.parquet"), "--table", str(tmp_path / "t")],
        "features": ["features", "--data", str(demo_csv), "--spec", "logmel(bands=8)", "-o", str(tmp_path / "t")],
    }[command]
    if command == "classify":
        assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set",
                     "components=2", "-o", str(tmp_path / "m.wt")]) == 0
        capsys.readouterr()
    code = main([*argv, *SPARK])
    err = capsys.readouterr().err
    assert code == 2 and "exists and is not a folder" in err and len(err.strip().splitlines()) == 1, err
