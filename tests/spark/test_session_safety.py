"""The driver's log configuration file: written through an exclusive temporary file, never
through a link or a file someone else owns (the JVM would read what they wrote)."""
import os
import tempfile

import pytest

from wavetrain.spark import session
from wavetrain.spark.session import QUIET_LOG4J2

NAME = f"wavetrain-log4j2-{os.getuid()}.properties"


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _content(path):
    with open(path) as f:
        return f.read()


def test_written_once_then_reused_with_no_temporary_file_left(tmp):
    path = session._quiet_log_config()
    assert path == str(tmp / NAME) and _content(path) == QUIET_LOG4J2
    inode = os.stat(path).st_ino
    assert session._quiet_log_config() == path and os.stat(path).st_ino == inode
    assert sorted(os.listdir(tmp)) == [NAME]


def test_a_stale_file_is_replaced_atomically(tmp):
    (tmp / NAME).write_text("rootLogger.level = all\n")
    path = session._quiet_log_config()
    assert path == str(tmp / NAME) and _content(path) == QUIET_LOG4J2
    assert sorted(os.listdir(tmp)) == [NAME]


def test_a_planted_link_is_never_written_through_nor_read(tmp):
    victim = tmp / "victim.txt"
    victim.write_text("precious\n")
    (tmp / NAME).symlink_to(victim)
    path = session._quiet_log_config()
    assert victim.read_text() == "precious\n"
    assert path != str(tmp / NAME) and _content(path) == QUIET_LOG4J2
    assert not os.path.islink(path) and os.stat(path).st_uid == os.getuid()
    assert oct(os.stat(path).st_mode & 0o077) == "0o0"           # a private file


def test_a_link_to_a_file_with_the_right_content_is_not_trusted(tmp):
    theirs = tmp / "theirs.properties"
    theirs.write_text(QUIET_LOG4J2)
    (tmp / NAME).symlink_to(theirs)
    path = session._quiet_log_config()
    assert path != str(tmp / NAME)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_another_users_file_with_the_right_content_is_not_used_as_it_is(tmp):
    (tmp / NAME).write_text(QUIET_LOG4J2)
    os.chown(tmp / NAME, 12345, 12345)
    path = session._quiet_log_config()
    assert os.stat(path).st_uid == os.getuid() and _content(path) == QUIET_LOG4J2


def test_a_file_others_may_write_is_replaced_by_one_they_cannot(tmp):
    (tmp / NAME).write_text(QUIET_LOG4J2)
    os.chmod(tmp / NAME, 0o666)
    old = os.umask(0)
    try:
        path = session._quiet_log_config()
    finally:
        os.umask(old)
    assert path == str(tmp / NAME) and _content(path) == QUIET_LOG4J2
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert sorted(os.listdir(tmp)) == [NAME]
