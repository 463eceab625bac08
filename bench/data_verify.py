"""What trusting a cached prepared shard costs: hash every file at start (what the trainer does) vs a
check at each row's first read (the alternative), on CPU.

Writes prepared-format shards of random uint8 rows at the given resolution into a temporary directory,
then times, with the page cache warm (the common case: the node just fetched or trained from them):
  - start: `bad_files` over every shard, sha256 in parallel threads (model/data/prepared.py);
  - first read: the loader's copy of one row out of the memory map, with and without a sha256 of it
    (what a per-row check would add to each item a loader worker reads the first time).

    python bench/data_verify.py --resolution 256 --shards 4 --shard-mib 64 --repeats 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from model.data.loader import cpus_available
from model.data.prepared import bad_files, sha256_file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--resolution", type=int, default=256)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    row_bytes = 3 * args.resolution**2
    rows = max(1, args.shard_mib * 2**20 // row_bytes)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shards = []
        for k in range(args.shards):
            name = f"shard-{k:05d}.npy"
            np.save(root / name, rng.integers(0, 255, (rows, 3, args.resolution, args.resolution), dtype=np.uint8))
            shards.append({"file": name, "count": rows, "bytes": (root / name).stat().st_size, "sha256": ""})
        for s in shards:
            s["sha256"] = sha256_file(root / s["file"])  # also warms the page cache
        (root / "captions.jsonl").write_text("")
        manifest = {
            "shards": shards,
            "captions": {"file": "captions.jsonl", "bytes": 0, "sha256": sha256_file(root / "captions.jsonl")},
        }
        total = sum(s["bytes"] for s in shards)

        start = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            assert bad_files(root, manifest) == []
            start.append(time.perf_counter() - t)

        maps = [np.load(root / s["file"], mmap_mode="r") for s in shards]
        n = min(rows, 512)
        plain, hashed = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            for i in range(n):
                np.array(maps[i % len(maps)][i])
            plain.append((time.perf_counter() - t) / n)
            t = time.perf_counter()
            for i in range(n):
                row = np.array(maps[i % len(maps)][i])
                hashlib.sha256(row.data).hexdigest()
            hashed.append((time.perf_counter() - t) / n)
        out = {
            "cpus": cpus_available(),
            "resolution": args.resolution,
            "total_mib": round(total / 2**20, 1),
            "start_hash_s": round(min(start), 3),
            "start_hash_gib_per_s": round(total / 2**30 / min(start), 2),
            "row_copy_us": round(min(plain) * 1e6, 1),
            "row_copy_and_sha256_us": round(min(hashed) * 1e6, 1),
            "row_sha256_extra_us": round((min(hashed) - min(plain)) * 1e6, 1),
        }
        print(json.dumps(out))


if __name__ == "__main__":
    main()
