"""Storage hardening: requests that must never leave, lost PUT answers, fork safety, a
multipart upload aborted by Ctrl-C and the memory of a large single PUT. Real SeaweedFS. The
local store's faults: test_local_store_faults.py."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET

import pytest

from credential_servers import FakeAws
from fault_proxy import drop_response, stall_after
from memory import CHILD_PRELUDE
from seaweed import config_for
from syvain_training_data import storage
from syvain_training_data.testing import storage_policy

MIB = 1024 * 1024

# --- 1. bucket names that could redirect a request ---------------------------------------------


@pytest.mark.parametrize("virtual_hosted", [False, True])
def test_bucket_that_could_redirect_a_request_fails_before_any_request(seaweed, virtual_hosted):
    """Bucket names that would send a request to the host they name (127.0.0.1:PORT, a server
    of ours that records every request) are ValueErrors before any request: after them, one
    request sent to that server on purpose is the only one it received."""
    # A host name: a virtual-hosted bucket becomes its sub-domain (an IP has none).
    endpoint = f"http://localhost:{seaweed.port}"
    config = config_for(seaweed, endpoint, virtual_hosted_style_request=virtual_hosted)
    with FakeAws() as named:
        port = named.url.rsplit(":", 1)[1]
        for bucket in [
            f"127.0.0.1:{port}#",
            f"x@127.0.0.1:{port}",
            f"127.0.0.1:{port}?",
            "a%2e",
            "a b",
            "a\tb",
            "a\\b",
        ]:
            uri = f"s3://{bucket}/x.json"
            for operation in (
                lambda uri=uri: storage.get_object(uri, storage_config=config),
                lambda uri=uri: storage.put_object(uri, b"{}", storage_config=config),
                lambda uri=uri: storage.head_object(uri, storage_config=config),
                lambda uri=uri: storage.open_stream(
                    uri, size_bytes=2, storage_config=config
                ).read(),
            ):
                with pytest.raises(ValueError, match="bucket name"):
                    operation()
        # The server accepts connections one after another: any connection of theirs was made
        # before this request's, so it was accepted before this request was answered.
        control = config_for(seaweed, named.url)
        assert storage.get_object("s3://control/x.json", storage_config=control) == b"hello"
        assert named.connections == 1
        assert [(method, path) for method, path, _ in named.requests] == [
            ("GET", "/control/x.json")
        ]


# --- 5. a lost PUT answer ------------------------------------------------------------------------


def test_create_only_put_whose_answer_was_lost_succeeds_on_its_own_bytes(
    seaweed, fault_proxy, s3_bucket, unique_prefix, tmp_path
):
    config = config_for(seaweed, endpoint=fault_proxy.endpoint)
    data = random.Random(5).randbytes(MIB + 3)
    spooled = tmp_path / "spool.bin"
    spooled.write_bytes(data)
    writers = {
        "put": lambda uri: storage.put_object(uri, data, storage_config=config, create_only=True),
        "put_chunks": lambda uri: storage.put_object(
            uri, [data[:1000], data[1000:]], storage_config=config, create_only=True
        ),
        "put_file": lambda uri: storage.put_file(
            uri, spooled, storage_config=config, create_only=True
        ),
    }
    with storage_policy(backoff_base_s=0.01, backoff_cap_s=0.05):
        for name, write in writers.items():
            uri = f"s3://{s3_bucket}/{unique_prefix}/{name}.bin"
            fault_proxy.script(drop_response(method="PUT"))
            write(uri)
            assert fault_proxy.pending_faults == 0
            assert storage.get_object(uri, storage_config=config) == data
            # Other bytes under the same key stay a conflict, lost answer or not.
            fault_proxy.script(drop_response(method="PUT"))
            with pytest.raises(FileExistsError, match=uri):
                storage.put_object(uri, data[:-1] + b"!", storage_config=config, create_only=True)
            assert storage.get_object(uri, storage_config=config) == data


# --- 6. fork while another thread streams --------------------------------------------------------


def test_fork_while_another_thread_streams_leaves_a_working_child(tmp_path):
    data = random.Random(6).randbytes(4 * MIB)
    (tmp_path / "obj.bin").write_bytes(data)
    uri = f"file://{tmp_path}/obj.bin"
    script = textwrap.dedent(
        f"""
        import os, sys, threading, time
        from syvain_training_data import storage
        uri, size = {uri!r}, {len(data)}
        stop = threading.Event()
        def stream_forever():
            while not stop.is_set():
                with storage.open_stream(uri, size_bytes=size) as stream:
                    for _ in stream:
                        pass
        threads = [threading.Thread(target=stream_forever) for _ in range(2)]
        for thread in threads:
            thread.start()
        hung = 0
        for _ in range(60):
            pid = os.fork()
            if pid == 0:
                ok = storage.open_stream(uri, size_bytes=size).read() == storage.get_object(uri)
                os._exit(0 if ok else 3)
            deadline = time.monotonic() + 20
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    assert os.waitstatus_to_exitcode(status) == 0, status
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    hung += 1
                    break
                time.sleep(0.01)
        stop.set()
        for thread in threads:
            thread.join()
        print(f"hung children: {{hung}}")
        sys.exit(1 if hung else 0)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --- 7. interrupted writes leave nothing behind --------------------------------------------------


def list_multipart_uploads(seaweed, bucket: str, key: str) -> list[str]:
    response = seaweed.request("GET", f"/{bucket}", query={"uploads": "", "prefix": key})
    assert response.status == 200, response.body
    root = ET.fromstring(response.body)
    return [el.text or "" for el in root.iter() if el.tag.endswith("UploadId")]


def test_ctrl_c_during_a_multipart_upload_aborts_it(
    seaweed, fault_proxy, s3_bucket, unique_prefix, tmp_path
):
    source = tmp_path / "big.bin"
    source.write_bytes(random.Random(7).randbytes(24 * MIB))
    key = f"{unique_prefix}/interrupted.bin"
    # The third part stalls, so Ctrl-C comes while the upload is open.
    fault_proxy.script(stall_after(0, 60.0, method="PUT", target="partNumber=3"))
    script = CHILD_PRELUDE + textwrap.dedent(
        f"""
        import signal, sys
        from syvain_training_data import storage
        signal.signal(signal.SIGINT, signal.default_int_handler)
        config = s3_config({fault_proxy.endpoint!r}, {seaweed.region!r})
        print("uploading", flush=True)
        try:
            storage.put_file("s3://{s3_bucket}/{key}", {str(source)!r}, storage_config=config,
                multipart_threshold=5 * 2**20, part_size=5 * 2**20)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(7)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **seaweed.env()),
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "uploading"
    deadline = time.monotonic() + 60
    while not list_multipart_uploads(seaweed, s3_bucket, key) or fault_proxy.pending_faults:
        assert time.monotonic() < deadline, "the upload never reached its third part"
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 7 and "interrupted" in out, out + err
    assert list_multipart_uploads(seaweed, s3_bucket, key) == []


# --- 8. a large single PUT keeps its memory bounded ------------------------------------------


def test_a_1_gib_create_only_upload_keeps_process_memory_bounded(
    seaweed, s3_bucket, unique_prefix, tmp_path
):
    source = tmp_path / "shard.bin"
    block = random.Random(8).randbytes(MIB)
    with source.open("wb") as out:
        for _ in range(1024):
            out.write(block)
    uri = f"s3://{s3_bucket}/{unique_prefix}/one-gib.bin"
    script = CHILD_PRELUDE + textwrap.dedent(
        f"""
        import threading, time
        from syvain_training_data import storage

        def status(field):
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return int(line.split()[1]) * 1024
            raise KeyError(field)

        config = s3_config({seaweed.endpoint!r}, {seaweed.region!r})
        storage.list_objects("s3://{s3_bucket}/{unique_prefix}/", storage_config=config)
        base_anon = status("RssAnon")
        peak = {{"anon": base_anon, "file": 0}}
        done = threading.Event()
        def sample():
            while not done.is_set():
                peak["anon"] = max(peak["anon"], status("RssAnon"))
                peak["file"] = max(peak["file"], status("RssFile"))
                time.sleep(0.02)
        sampler = threading.Thread(target=sample)
        sampler.start()
        size = storage.put_file(
            {uri!r}, {str(source)!r}, storage_config=config, create_only=True
        ).size
        done.set()
        sampler.join()
        assert size == 2**30, size
        print((peak["anon"] - base_anon) // 2**20, peak["file"] // 2**20)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, **seaweed.env()),
    )
    assert done.returncode == 0, done.stderr
    anon_growth_mib, peak_file_mib = map(int, done.stdout.split())
    print(
        f"1 GiB single PUT: anonymous RSS growth {anon_growth_mib} MiB, "
        f"file pages {peak_file_mib} MiB"
    )
    assert anon_growth_mib < 200
    assert storage.head_object(uri, storage_config=config_for(seaweed)).size == 2**30
    storage.delete_object(uri, storage_config=config_for(seaweed))
