"""`ablate import` of crafted tracker files (orchestrator/trackers/exports.py): W&B records are read in
linear time, and every malformed file ends in one line naming it, never a traceback. The .wandb files are
written here in the format's own framing (LevelDB's log with W&B's header) from wandb's protobuf records."""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from orchestrator.results.curves import CurvesError
from orchestrator.trackers.exports import BLOCK, FIRST, FULL, LAST, MIDDLE, RECORD_HEADER, tracker_export_curves

pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")


def wandb_file(path: Path, records: list[bytes], chunk: int = BLOCK) -> Path:
    """A .wandb file holding `records`, each cut into chunks of at most `chunk` bytes."""
    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))

    def put(kind: int, data: bytes) -> None:
        if BLOCK - len(out) % BLOCK < RECORD_HEADER.size:
            out.extend(b"\0" * (BLOCK - len(out) % BLOCK))
        crc = zlib.crc32(data, zlib.crc32(bytes([kind])))
        out.extend(RECORD_HEADER.pack(crc, len(data), kind) + data)

    for record in records:
        if len(record) <= BLOCK - len(out) % BLOCK - RECORD_HEADER.size and len(record) <= chunk:
            put(FULL, record)
            continue
        parts = [record[i : i + chunk] for i in range(0, len(record), chunk)]
        if len(parts) == 1:
            put(FULL, parts[0])
        else:
            put(FIRST, parts[0])
            for middle in parts[1:-1]:
                put(MIDDLE, middle)
            put(LAST, parts[-1])
    path.write_bytes(bytes(out))
    return path


def history(step: int, **values: Any) -> bytes:  # noqa: ANN401
    record = pb.Record()
    for key, value in {"_step": step, **values}.items():
        item = record.history.item.add()
        item.key, item.value_json = key, value if isinstance(value, str) else repr(value)
    return record.SerializeToString()


def run_record(name: str) -> bytes:
    record = pb.Record()
    record.run.run_id, record.run.display_name = "r1", name
    return record.SerializeToString()


def test_a_record_of_many_small_chunks_is_read_in_linear_time(tmp_path: Path) -> None:
    """One history record of 1 MiB cut into 1-byte chunks (8 MiB of file): joining the chunks once takes
    about a second; appending each to the bytes so far copied ~5e11 bytes (many minutes)."""
    big = history(10, recon_lpips=0.5, note='"' + "x" * (1 << 20) + '"')
    path = wandb_file(tmp_path / "run-r1.wandb", [run_record("A_slow"), big], chunk=1)
    start = time.monotonic()
    (curve,) = tracker_export_curves(path).values()
    took = time.monotonic() - start
    assert curve.label == "A_slow" and curve.checkpoints[0].step == 10
    assert took < 30, f"{took:.1f} s"


def nested_under_a_number() -> bytes:
    record = pb.Record()
    item = record.config.update.add()
    item.key, item.value_json = "lr", "0.001"
    nested = record.config.update.add()
    nested.nested_key.extend(["lr", "schedule"])
    nested.value_json = '"cosine"'
    return record.SerializeToString()


@pytest.mark.parametrize(
    ("record", "said"),
    [
        (b"\xff\xff\xff\xff", "DecodeError"),  # not protobuf
        (nested_under_a_number(), "nested key 'lr.schedule'"),
        (history(10, recon_lpips="{not json"), "JSONDecodeError"),
        (history(10, _step="1e999"), "OverflowError"),
    ],
    ids=["not protobuf", "nested key under a number", "value not JSON", "step past any integer"],
)
def test_a_malformed_wandb_record_is_one_line_naming_the_file(
    tmp_path: Path, database_url: str, ablate_cli: Any, record: bytes, said: str  # noqa: ANN401
) -> None:
    path = wandb_file(tmp_path / "run-r1.wandb", [run_record("A_bad"), record])
    with pytest.raises(CurvesError, match=said) as caught:
        tracker_export_curves(path)
    assert str(path) in str(caught.value) and "record 1" in str(caught.value)
    out = ablate_cli(database_url, "import", str(path), "--name", "crafted")
    assert out.returncode == 2 and str(path) in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_tensorboard_record_claiming_a_tebibyte_is_one_line_naming_the_file(
    tmp_path: Path, database_url: str, ablate_cli: Any  # noqa: ANN401
) -> None:
    """A TFRecord header whose length (1 TiB) has a valid checksum: TensorBoard's reader allocated it."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    run = tmp_path / "tb" / "A_huge"
    run.mkdir(parents=True)
    header = struct.pack("<Q", 1 << 40)
    events = run / "events.out.tfevents.1.host"
    events.write_bytes(header + struct.pack("<I", masked_crc32c(header)) + b"abc" * 10)
    with pytest.raises(CurvesError, match="claims 1099511627776 bytes") as caught:
        tracker_export_curves(tmp_path / "tb")
    assert str(events) in str(caught.value)
    out = ablate_cli(database_url, "import", str(tmp_path / "tb"), "--name", "huge")
    assert out.returncode == 2 and str(events) in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("text", "said"),
    [("_step,loss\ninf,0.5\n", "_step must be a non-negative integer"),
     ("Step,A - loss\nnan,0.5\n", "Step must be a non-negative integer"),
     ("_step,loss\n1," + "x" * 200_000 + "\n", "not a readable CSV file")],
    ids=["an infinite step", "a step that is not a number", "a field past csv's limit"],
)
def test_a_malformed_csv_export_is_one_line_naming_the_file(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "export.csv"
    path.write_text(text)
    with pytest.raises(CurvesError, match=said) as caught:
        tracker_export_curves(path)
    assert str(path) in str(caught.value)
