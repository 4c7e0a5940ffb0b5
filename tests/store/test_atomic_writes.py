"""A writer killed with SIGKILL never leaves a corrupt or half-visible entry."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.store.store_helpers import SPEC, rec_id
from wavetrain.store import FeatureStore, entry_bytes

RID = rec_id(42)
SHAPE = (1000, 64)

# The child stores np.full(SHAPE, 7) and is frozen at a chosen point of the write (by patching the
# step that follows), then killed by the parent.  ``ready`` tells the parent it is there.
CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from wavetrain.store import FeatureStore, _format

    root, mode, ready, rid, spec, max_bytes = sys.argv[1:7]
    store = FeatureStore(root, max_bytes=int(max_bytes) or None)

    def freeze():
        open(ready, "w").close()
        time.sleep(600)

    if mode == "mid_data":
        def write_entry(f, data, **kw):
            f.write(_format.pack_header(data))
            f.write(memoryview(data).cast("B")[: data.nbytes // 2])
            f.flush()
            freeze()
        _format.write_entry = write_entry
    elif mode == "before_replace":
        real_write = _format.write_entry
        def write_entry(f, data, **kw):
            real_write(f, data, **kw)
            freeze()
        _format.write_entry = write_entry
    elif mode == "after_replace":            # file in place, index transaction not committed
        real_replace = os.replace
        def replace(a, b):
            real_replace(a, b)
            freeze()
        os.replace = replace
    elif mode == "mid_eviction":             # one victim unlinked, transaction not committed
        real_unlink = os.unlink
        def unlink(p, *a, **k):
            real_unlink(p, *a, **k)
            if str(p).endswith(".gram"):
                freeze()
        os.unlink = unlink
    store.put(rid, spec, np.full({shape!r}, 7.0, np.float32))
    print("finished without being killed", flush=True)
""").replace("{shape!r}", repr(SHAPE))


def _run_and_kill(tmp_path, root, mode, max_bytes=0):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    ready = tmp_path / f"ready-{mode}"
    proc = subprocess.Popen([sys.executable, str(script), str(root), mode, str(ready), RID, SPEC,
                             str(max_bytes)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if proc.poll() is not None:
                raise AssertionError(f"child exited early: {proc.communicate()}")
            if time.monotonic() > deadline:
                raise AssertionError("child never reached the kill point")
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def _files_on_disk(root):
    return {p.name: p.stat().st_size for p in root.rglob("*.gram")}


def _check_consistent(store, root):
    """Index bytes equal bytes on disk after every entry was read once."""
    info = store.info()
    assert info["bytes"] == sum(_files_on_disk(root).values())
    assert info["entries"] == len(_files_on_disk(root))


@pytest.mark.parametrize("mode", ["mid_data", "before_replace", "after_replace"])
@pytest.mark.parametrize("existing", [False, True])
def test_kill_during_put(tmp_path, mode, existing):
    root = tmp_path / "store"
    old = np.full(SHAPE, 3.0, np.float32)
    if existing:
        s = FeatureStore(root)
        s.put(RID, SPEC, old)
        s.close()
    _run_and_kill(tmp_path, root, mode)
    assert list((root / "tmp").iterdir()) or mode == "after_replace"   # the child's leftovers

    store = FeatureStore(root)                       # opening cleans the dead writer's temp file
    assert list((root / "tmp").iterdir()) == []
    got = store.get(RID, SPEC)
    if mode == "after_replace":
        expected = np.full(SHAPE, 7.0, np.float32)   # rename happened: the new, complete entry
    else:
        expected = old if existing else None
    if expected is None:
        assert got is None
        assert not store.contains(RID, SPEC)
    else:
        np.testing.assert_array_equal(got, expected)
    _check_consistent(store, root)

    # the store stays usable: lock and index were released by the kill
    store.put(RID, SPEC, np.full(SHAPE, 9.0, np.float32))
    np.testing.assert_array_equal(FeatureStore(root).get(RID, SPEC), np.full(SHAPE, 9.0))
    _check_consistent(store, root)


def test_kill_during_eviction(tmp_path):
    root = tmp_path / "store"
    e = entry_bytes(*SHAPE)
    s = FeatureStore(root)
    for i in range(3):
        s.put(rec_id(i), SPEC, np.full(SHAPE, float(i), np.float32))
    s.close()
    _run_and_kill(tmp_path, root, "mid_eviction", max_bytes=2 * e)

    store = FeatureStore(root, max_bytes=2 * e)
    results = {i: store.get(rec_id(i), SPEC) for i in range(3)}
    results[42] = store.get(RID, SPEC)
    for i, got in results.items():
        assert got is None or np.array_equal(got, np.full(SHAPE, 7.0 if i == 42 else float(i)))
    assert results[0] is None                        # the victim's file was unlinked
    _check_consistent(store, root)
    store.put(rec_id(5), SPEC, np.full(SHAPE, 5.0, np.float32))
    assert store.info()["bytes"] <= 2 * e
    _check_consistent(store, root)


LOOP_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from wavetrain.store import FeatureStore
    root, rid, spec = sys.argv[1:4]
    store = FeatureStore(root)
    for k in range(1, 10**6):
        store.put(rid, spec, np.full((1024, 512), float(k), np.float32))   # 2 MiB per put
        print(k, flush=True)
""")


@pytest.mark.parametrize("after_puts", [1, 3, 6])
def test_kill_at_an_arbitrary_moment(tmp_path, after_puts):
    """Kill a writer looping over big puts of one key at an unplanned point of its loop."""
    root = tmp_path / "store"
    script = tmp_path / "loop.py"
    script.write_text(LOOP_CHILD)
    proc = subprocess.Popen([sys.executable, str(script), str(root), RID, SPEC],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(after_puts):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
        time.sleep(0.001 * after_puts)               # somewhere inside the next put
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    store = FeatureStore(root)
    got = store.get(RID, SPEC)
    assert got is not None                           # at least `after_puts` puts completed
    assert got.shape == (1024, 512)
    assert np.all(got == got[0, 0]) and got[0, 0] >= after_puts
    assert list((root / "tmp").iterdir()) == []
    store.put(RID, SPEC, np.zeros((4, 4), np.float32))
    np.testing.assert_array_equal(store.get(RID, SPEC), np.zeros((4, 4)))


def test_stale_temp_file_of_live_process_is_kept(tmp_path):
    root = tmp_path / "store"
    FeatureStore(root)
    import socket

    host = socket.gethostname().replace("/", "_") or "host"
    mine = root / "tmp" / f"{RID[:16]}.{host}.{os.getpid()}.abcd1234.tmp"
    mine.write_bytes(b"in progress")
    old = root / "tmp" / f"{RID[:16]}.otherhost.1.abcd1234.tmp"
    old.write_bytes(b"left by a crash on another host")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    FeatureStore(root)
    assert mine.exists() and not old.exists()
