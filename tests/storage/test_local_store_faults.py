"""The local directory store's faults: file:// objects must be regular files, local errors that
cannot heal (not a directory, no space, read-only, permission) fail at once, local etags are
not enforced, staged writes are cleaned up by age and flushed before and after they are linked,
and a range past a file's end fails at once. Real local files, real mounts."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from syvain_training_data import storage
from syvain_training_data.testing import storage_policy

MIB = 1024 * 1024
# Far under the 15-minute retry window: anything that fails "at once" fails well inside this.
FAIL_FAST_S = 10.0


def outcome_within(
    seconds: float, call: Callable[[], object]
) -> tuple[BaseException | None, float]:
    """Runs `call` in a thread; returns (exception or None, seconds taken). Fails the test when
    it is still running after `seconds` (a hang)."""
    result: list[BaseException | None] = []
    started = time.monotonic()

    def run() -> None:
        try:
            call()
            result.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still running after {seconds} s (hang)")
    return result[0], time.monotonic() - started


# --- 2. file:// objects must be regular files --------------------------------------------------


@contextlib.contextmanager
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "shard.bin"
    os.mkfifo(path)
    try:
        yield path
    finally:
        # Releases a reader that old code left blocked in open().
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def test_a_fifo_is_an_error_naming_it_never_a_hang(tmp_path):
    with fifo(tmp_path) as path:
        uri = f"file://{path}"
        for operation in (
            lambda: storage.get_object(uri),
            lambda: storage.head_object(uri),
            lambda: storage.open_stream(uri, size_bytes=10).read(),
            lambda: storage.download_object(uri, tmp_path / "copy", size_bytes=10),
            lambda: storage.put_file(f"file://{tmp_path}/out.bin", path),
        ):
            error, seconds = outcome_within(FAIL_FAST_S, operation)
            assert isinstance(error, OSError), error
            assert str(path) in str(error) and "not a regular file (a FIFO)" in str(error)
            assert seconds < FAIL_FAST_S
        assert not (tmp_path / "copy").exists() and not (tmp_path / "out.bin").exists()


def test_a_device_is_an_error_not_an_endless_read():
    for operation in (
        lambda: storage.get_object("file:///dev/zero"),
        lambda: storage.open_stream("file:///dev/zero", size_bytes=10).read(),
    ):
        error, _ = outcome_within(FAIL_FAST_S, operation)
        assert isinstance(error, OSError) and "/dev/zero" in str(error), error
        assert "not a regular file (a device)" in str(error)


# --- 3. local errors that cannot heal fail at once --------------------------------------------


def test_not_a_directory_fails_at_once(tmp_path):
    (tmp_path / "afile").write_bytes(b"x")
    uri = f"file://{tmp_path}/afile/x.json"
    for operation in (
        lambda: storage.put_object(uri, b"{}"),
        lambda: storage.put_object(uri, b"{}", create_only=True),
        lambda: storage.get_object(uri),
        lambda: storage.open_stream(uri, size_bytes=2).read(),
    ):
        error, seconds = outcome_within(FAIL_FAST_S, operation)
        assert isinstance(error, NotADirectoryError), error
        assert f"{tmp_path}/afile" in str(error)
        print(f"ENOTDIR failed after {seconds:.3f} s")


@contextlib.contextmanager
def tmpfs(size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A small real tmpfs (tests run as root, or with sudo on CI)."""
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    mount_point = Path(tempfile.mkdtemp(prefix="syvain-tmpfs-"))
    subprocess.run(
        [*sudo, "mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mount_point], check=True
    )
    try:
        if read_only:
            (mount_point / "dataset").mkdir()
            (mount_point / "dataset" / "old.json").write_bytes(b"{}")
            subprocess.run([*sudo, "mount", "-o", "remount,ro", mount_point], check=True)
        yield mount_point
    finally:
        subprocess.run([*sudo, "umount", mount_point], check=True)
        mount_point.rmdir()


def test_no_space_fails_at_once(tmp_path):
    source = tmp_path / "big.bin"
    source.write_bytes(random.Random(3).randbytes(2 * MIB))
    with tmpfs("1m") as root:
        uri = f"file://{root}/dataset/shard.bin"
        for operation in (
            lambda: storage.put_object(uri, source.read_bytes()),
            lambda: storage.put_file(uri, source, create_only=True),
        ):
            error, seconds = outcome_within(FAIL_FAST_S, operation)
            assert isinstance(error, OSError) and error.errno == 28, error  # ENOSPC
            assert str(root) in str(error)
            print(f"ENOSPC failed after {seconds:.3f} s")
        assert storage.list_objects(f"file://{root}/dataset/") == []


def test_read_only_file_system_fails_at_once(tmp_path):
    source = tmp_path / "small.bin"
    source.write_bytes(b"0123456789")
    with tmpfs("1m", read_only=True) as root:
        uri = f"file://{root}/dataset/new.json"
        for operation in (
            lambda: storage.put_object(uri, b"{}"),
            lambda: storage.put_file(uri, source),
            lambda: storage.delete_object(f"file://{root}/dataset/old.json"),
        ):
            error, seconds = outcome_within(FAIL_FAST_S, operation)
            assert isinstance(error, OSError) and error.errno == 30, error  # EROFS
            assert str(root) in str(error)
            print(f"EROFS failed after {seconds:.3f} s")


def test_permission_denied_fails_at_once_as_permission_error(tmp_path):
    """Root passes permission checks, so there the writer runs without the capabilities that
    override them (setpriv), like an ordinary user."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    script = textwrap.dedent(
        f"""
        import time
        from syvain_training_data import storage
        started = time.monotonic()
        try:
            storage.put_object("file://{locked}/x.json", b"{{}}")
        except PermissionError as error:
            assert "{locked}" in str(error), error
            print(f"PermissionError after {{time.monotonic() - started:.3f}} s")
        """
    )
    unprivileged = (
        ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
        if os.geteuid() == 0
        else []
    )
    done = subprocess.run(
        [*unprivileged, sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("PermissionError after "), done.stdout + done.stderr
    print(done.stdout.strip())
    assert float(done.stdout.split()[2]) < FAIL_FAST_S


# --- 4. local etags are not enforced ---------------------------------------------------------


def test_a_copied_local_dataset_reads_with_the_old_etags(tmp_path):
    data = random.Random(4).randbytes(3 * MIB + 17)
    original = tmp_path / "original"
    uri = f"file://{original}/shards/000.bin"
    info = storage.put_object(uri, data)
    assert info.etag
    copy = tmp_path / "restored"
    shutil.copytree(original, copy)  # new inodes, new mtimes: a new local etag
    copied = f"file://{copy}/shards/000.bin"
    assert storage.head_object(copied).etag != info.etag
    with storage.open_stream(copied, size_bytes=len(data), etag=info.etag) as stream:
        assert stream.read() == data
    size, _ = storage.download_object(
        copied, tmp_path / "downloaded", size_bytes=len(data), etag=info.etag
    )
    assert size == len(data) and (tmp_path / "downloaded").read_bytes() == data
    # The size still guards the read.
    with pytest.raises(RuntimeError, match="size mismatch"):
        storage.open_stream(copied, size_bytes=len(data) + 1, etag=info.etag).read()


def test_abandoned_local_staging_files_are_removed_by_age_not_by_process_id(tmp_path):
    """A staged copy is another writer's while its modification time is fresh (a writer on
    another host has process ids this host cannot check); one untouched for an hour was left by
    a killed writer and goes. Neither ever shows up as an object."""
    dest = tmp_path / "store" / "shards" / "000.bin"
    dest.parent.mkdir(parents=True)
    abandoned = dest.with_name(f"000.bin#{1234:020}")
    abandoned.write_bytes(b"partial")
    two_hours_ago = time.time() - 2 * 3600
    os.utime(abandoned, (two_hours_ago, two_hours_ago))
    in_progress = dest.with_name(f"001.bin#{5678:020}")
    in_progress.write_bytes(b"being written elsewhere")
    assert storage.list_objects(f"file://{tmp_path}/store/") == []
    source = tmp_path / "source.bin"
    source.write_bytes(b"complete")
    storage.put_file(f"file://{dest}", source, create_only=True)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["000.bin", in_progress.name]
    assert [o.uri for o in storage.list_objects(f"file://{tmp_path}/store/")] == [f"file://{dest}"]


STRACE = shutil.which("strace")


def traced_calls(tmp_path: Path, script: str, syscalls: str) -> list[str]:
    """The ``syscalls`` a Python process running ``script`` makes on paths under ``tmp_path``
    (strace, with file descriptors shown as their paths), in order."""
    assert STRACE, "this test needs strace (apt-get install strace; .ci/run installs it)"
    trace = tmp_path / "trace.txt"
    command = [STRACE, "-f", "-y", "-o", str(trace), "-e", f"trace={syscalls}"]
    done = subprocess.run(
        [*command, sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = trace.read_text().splitlines()
    return [line.split(None, 1)[1] for line in lines if str(tmp_path) in line]


def assert_flushed_around(calls: list[str], names: tuple[str, ...]) -> int:
    """Every call of ``names`` (link or rename of a staged copy) comes after an fsync of the
    staged copy and before an fsync of the target's directory; returns how many there were."""
    moves = [i for i, call in enumerate(calls) if call.startswith(tuple(f"{n}(" for n in names))]
    for at in moves:
        staged = calls[at].split('"')[1]
        target_dir = os.path.dirname(calls[at].split('"')[3])
        synced_before = [c for c in calls[:at] if c.startswith("fsync(") and staged in c]
        synced_after = [
            c for c in calls[at + 1 :] if c.startswith("fsync(") and f"<{target_dir}>" in c
        ]
        assert synced_before, (calls[at], calls[:at])
        assert synced_after, (calls[at], calls[at + 1 :])
    return len(moves)


@pytest.mark.parametrize("writer", ["put_object", "put_file", "saver"])
def test_local_create_only_writes_are_flushed_before_and_after_they_are_linked(tmp_path, writer):
    """Power loss after a commit must not leave an empty or partial object: the staged copy is
    fsync-ed before it is linked into place, and the directory after (strace shows the calls)."""
    root = tmp_path / "store"
    script = f"""
        import pathlib
        from syvain_training_data import SyvainTrainingData, storage
        root = pathlib.Path({str(root)!r})
        uri = f"file://{{root}}/deep/dir/object.json"
        if {writer!r} == "put_object":
            storage.put_object(uri, b'{{"a": 1}}', create_only=True)
        elif {writer!r} == "put_file":
            source = root.parent / "source.bin"
            source.write_bytes(b"x" * 100000)
            storage.put_file(uri, source, create_only=True)
        else:
            saver = SyvainTrainingData().dataset_saver(f"file://{{root}}/m.json")
            saver.save("train", None, [{{"i": 1}}], shard_id="a")
            saver.commit_manifest()
        """
    calls = traced_calls(tmp_path, script, "fsync,fdatasync,link,linkat")
    assert assert_flushed_around(calls, ("link", "linkat")), calls


@pytest.mark.parametrize("writer", ["put_object", "put_file"])
def test_local_overwrites_and_new_directories_are_flushed(tmp_path, writer):
    """An overwrite is staged, fsync-ed, renamed over the old object, and its directory fsync-ed
    after; each directory a write creates is flushed into its parent (fsync of the parent after
    the mkdir), so that the object's path survives power loss too (strace shows the calls)."""
    root = tmp_path / "store"
    script = f"""
        import pathlib
        from syvain_training_data import storage
        root = pathlib.Path({str(root)!r})
        uri = f"file://{{root}}/new/deeper/object.bin"
        source = root.parent / "source.bin"
        for content in (b"first", b"second" * 20000):
            if {writer!r} == "put_object":
                storage.put_object(uri, content)
            else:
                source.write_bytes(content)
                storage.put_file(uri, source)
        assert storage.get_object(uri) == content
        """
    calls = traced_calls(
        tmp_path, script, "fsync,fdatasync,rename,renameat,renameat2,mkdir,mkdirat"
    )
    assert assert_flushed_around(calls, ("rename", "renameat", "renameat2")) == 2, calls
    made = [
        (i, call.split('"')[1])
        for i, call in enumerate(calls)
        if call.startswith("mkdir") and call.endswith("= 0")
    ]
    assert [path for _, path in made] == [
        str(root),
        str(root / "new"),
        str(root / "new" / "deeper"),
    ], calls
    for at, path in made:
        parent = f"<{os.path.dirname(path)}>"
        assert [c for c in calls[at + 1 :] if c.startswith("fsync(") and parent in c], (path, calls)


def test_a_local_range_past_the_files_end_fails_at_once(tmp_path):
    """A file shorter than the range asked of it (a truncated object) is invalid data that no
    retry heals: an ObjectDataError at once, not fifteen minutes of retries."""
    from syvain_training_data.errors import ObjectDataError
    from syvain_training_data.storage import open_stream

    path = tmp_path / "short"
    path.write_bytes(b"x" * 13)
    # A short budget: a failure taken for a transient one ends as StorageRetryExhaustedError.
    policy = storage_policy(max_attempts=2, window_s=5, backoff_base_s=0.01, backoff_cap_s=0.05)
    uri = f"file://{path}"
    with (
        policy,
        pytest.raises(ObjectDataError, match="size mismatch"),
        open_stream(uri, size_bytes=1000, start=832, end=840) as stream,
    ):
        b"".join(stream)
