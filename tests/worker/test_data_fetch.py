"""data.url: prepared shards on an S3-compatible server (moto in server mode on loopback, as the
checkpoint-storage tests use), fetched into a node's cache once for all its arms, verified against the
manifest before training; a corrupt shard in the store is refused naming it, a damaged cached copy is
fetched again, and a tiny arm trains from the URL through the real worker."""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import multiprocessing
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from model.data import DatasetError, build_dataset
from model.data.prepare import prepare
from model.spec import ArmSpec
from orchestrator.grids.arms import deep_merge, resolve
from tests.kit.photos import SHARDS, photos
from tests.kit.polling import done_reply, wait_for
from tests.kit.settings import tiny_overrides
from worker.actor import ArmWorker
from worker.checkpoint_store import open_fs
from worker.data_fetch import DataStore, Fetched, cache_path, fetch_prepared


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The usual AWS variables (moto accepts any key); nothing may reach a real AWS endpoint.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ablate-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ablate-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def stored(s3_endpoint: str, aws_env: None, tmp_path: Path) -> tuple[str, DataStore]:
    """Six images prepared at 16 px into two shards (4 + 2), uploaded to s3://<a bucket of its own>/faces."""
    out = tmp_path / "prepared"
    prepare(photos(tmp_path / "src"), out, 16, shard_bytes=3 * 16 * 16 * 4)
    assert sorted(p.name for p in out.glob("shard-*.npy")) == SHARDS
    options = {"endpoint_url": s3_endpoint}
    bucket = f"ablate-data-{uuid.uuid4().hex[:8]}"  # the moto server outlives the test
    fs, _ = open_fs(f"s3://{bucket}", options)
    fs.mkdir(bucket)
    for name in ["manifest.json", "captions.jsonl", *SHARDS]:  # what prepare made, less its resume sidecars
        fs.put_file(str(out / name), f"{bucket}/faces/{name}")
    return f"s3://{bucket}/faces", DataStore(options=options, cache_dir=str(tmp_path / "node-cache"))


def _holds_open(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` open (an arm at the lock: waiting on it, or holding it)."""
    try:
        return any(Path(os.readlink(fd)) == path for fd in Path(f"/proc/{pid}/fd").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return False


def _flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


def test_two_arms_of_a_node_fetch_once_into_one_cache(stored: tuple[str, DataStore]) -> None:
    """Two arm processes fetch at once on one node: one downloads, the other waits on the lock and finds
    the copy complete. Both train from the same verified directory.

    The test holds the node's lock while both start, so both are seen waiting at the same time."""
    url, store = stored
    local = cache_path(Path(store.cache_dir), url)
    local.parent.mkdir(parents=True)
    with multiprocessing.get_context("spawn").Pool(
        2, initializer=importlib.import_module, initargs=("worker.data_fetch",)
    ) as pool:
        with open(local.with_name(local.name + ".lock"), "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            pending = pool.starmap_async(fetch_prepared, [(url, store), (url, store)], chunksize=1)
            lock = Path(held.name).resolve()
            pids = [p.pid for p in pool._pool]  # type: ignore[attr-defined]
            wait_for(lambda: all(_holds_open(pid, lock) for pid in pids), "both arms at the node's lock", 120)
            time.sleep(0.5)
            assert not pending.ready()
        a, b = pending.get(timeout=120)  # the lock is released with the file
    assert a.lock_wait_s > 0.4 and b.lock_wait_s > 0.4, "both arms waited on the lock together"
    assert isinstance(a, Fetched) and a.path == b.path == str(cache_path(Path(store.cache_dir), url))
    downloads = sorted([a.downloaded, b.downloaded], key=len)
    assert downloads[0] == [], "the second arm downloaded nothing"
    assert sorted(downloads[1]) == sorted([*SHARDS, "captions.jsonl"])
    fs, _ = open_fs(url, store.options)
    for name in SHARDS:
        assert (local / name).read_bytes() == fs.cat_file(f"{url.removeprefix('s3://')}/{name}")
    spec = ArmSpec.model_validate(
        {
            "model": {"size": "tiny"},
            "data": {"dataset": "prepared", "url": url, "resolution": 16, "held_out": 1},
            "eval": {"num_samples": 1},
        }
    )
    assert build_dataset(spec, local).num_train == 5
    with pytest.raises(DatasetError, match="fetch it first"):
        build_dataset(spec)


def test_a_corrupt_shard_in_the_store_is_refused_naming_it(stored: tuple[str, DataStore]) -> None:
    url, store = stored
    fs, _ = open_fs(url, store.options)
    key = f"{url.removeprefix('s3://')}/shard-00001.npy"
    fs.pipe_file(key, _flip_last_byte(fs.cat_file(key)))  # same size: only the checksum can tell
    msg = rf"shard-00001.npy fetched from {re.escape(url)}/shard-00001.npy does not match its checksum"
    with pytest.raises(DatasetError, match=msg):
        fetch_prepared(url, store)
    local = cache_path(Path(store.cache_dir), url)
    assert not (local / "shard-00001.npy").exists(), "the bad copy is not kept"
    assert not (local / "manifest.json").exists(), "an unverified copy has no manifest: nothing trains from it"


def test_a_damaged_cached_shard_is_fetched_again(stored: tuple[str, DataStore]) -> None:
    url, store = stored
    first = fetch_prepared(url, store)
    shard = Path(first.path) / "shard-00000.npy"
    shard.write_bytes(_flip_last_byte(shard.read_bytes()))
    again = fetch_prepared(url, store)
    assert again.downloaded == ["shard-00000.npy"]
    assert fetch_prepared(url, store).downloaded == []  # complete and verified: nothing to do


def test_a_url_without_a_manifest_says_what_to_upload(stored: tuple[str, DataStore]) -> None:
    url, store = stored
    elsewhere = url.replace("/faces", "/nothing")
    with pytest.raises(DatasetError, match=rf"{re.escape(elsewhere)}/manifest.json does not exist; upload"):
        fetch_prepared(elsewhere, store)


def test_an_arm_trains_from_data_url_through_the_worker(stored: tuple[str, DataStore], tmp_path: Path) -> None:
    url, store = stored
    over: dict[str, Any] = {"data": {"dataset": "prepared", "url": url, "resolution": 16, "held_out": 2}}
    spec = resolve("A", deep_merge({**tiny_overrides(30), "data": {}}, over)).model_dump(mode="json")
    spec["schedule"]["steps"] = 10
    reply = done_reply(ArmWorker(1, spec, str(tmp_path / "run"), data_store=store.__dict__))
    (record,) = reply["records"]
    fetched = record["data_fetch"]
    assert fetched["url"] == url and sorted(fetched["downloaded"]) == sorted([*SHARDS, "captions.jsonl"])
    assert Path(fetched["path"]).parent == Path(store.cache_dir)
    assert record["skipped_images"] == 0 and record["train_loss"] is not None


def test_a_file_url_is_fetched_the_same_way(tmp_path: Path) -> None:
    """file:// (a filesystem every node mounts): copied into the node's cache like any store."""
    out = tmp_path / "shared" / "photos"
    prepare(photos(tmp_path / "src"), out, 16, shard_bytes=3 * 16 * 16 * 4)
    store = DataStore(cache_dir=str(tmp_path / "cache"))
    fetched = fetch_prepared(f"file://{out}", store)
    assert sorted(fetched.downloaded) == sorted([*SHARDS, "captions.jsonl"])
    assert all((Path(fetched.path) / n).read_bytes() == (out / n).read_bytes() for n in SHARDS)
    assert fetch_prepared(f"file://{out}", store).downloaded == []


def test_a_cached_file_changed_on_the_node_is_fetched_again_however_it_looks(tmp_path: Path) -> None:
    """A bit flipped on the node's disk keeps the file's size and mtime: only its hash can tell."""
    out = tmp_path / "shared" / "photos"
    prepare(photos(tmp_path / "src"), out, 16, shard_bytes=3 * 16 * 16 * 4)
    store = DataStore(cache_dir=str(tmp_path / "cache"))
    local = Path(fetch_prepared(f"file://{out}", store).path)
    for name in ("shard-00001.npy", "captions.jsonl"):
        path = local / name
        st = path.stat()
        path.write_bytes(_flip_last_byte(path.read_bytes()))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = fetch_prepared(f"file://{out}", store)
    assert sorted(again.downloaded) == ["captions.jsonl", "shard-00001.npy"]
    assert all((local / n).read_bytes() == (out / n).read_bytes() for n in [*SHARDS, "captions.jsonl"])


def test_a_pinned_run_refuses_a_store_whose_manifest_changed(tmp_path: Path) -> None:
    out = tmp_path / "shared" / "photos"
    prepare(photos(tmp_path / "src"), out, 16, shard_bytes=3 * 16 * 16 * 4)
    url, store = f"file://{out}", DataStore(cache_dir=str(tmp_path / "cache"))
    pin = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    assert fetch_prepared(url, store, pin=pin).downloaded  # the manifest the run started on
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["source"] = "elsewhere"  # any change to the manifest, however small
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match=rf"{re.escape(url)}/manifest.json has changed since this run started"):
        fetch_prepared(url, store, pin=pin)
    assert fetch_prepared(url, store).downloaded == []  # a new run takes it: the same shards, nothing to fetch
