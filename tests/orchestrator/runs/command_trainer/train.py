"""A stand-in for a researcher's trainer (the standard library only): each flag is one behaviour a command
arm test needs. It reports a falling val_loss every --every steps with a checkpoint, as the contract asks."""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import sys
import time
import zlib
from pathlib import Path

RUN = Path(os.environ["ABLATE_RUN_DIR"])
STOP = Path(os.environ["ABLATE_STOP_FILE"])


def png(shade: int) -> bytes:
    """A 1x1 grey PNG (the standard library only)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    head = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(bytes([0, shade % 256]))) \
        + chunk(b"IEND", b"")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--step-s", type=float, default=0.02, help="the time one step takes")
    parser.add_argument("--ignore-stop", action="store_true", help="ignore the stop file and SIGTERM")
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--png", action="store_true", help="a picture in samples/step_N/ and a loss of its own")
    args = parser.parse_args()
    (RUN / "pid").write_text(str(os.getpid()))
    if args.ignore_stop:
        signal.signal(signal.SIGTERM, lambda *_: print("SIGTERM received; going on", file=sys.stderr, flush=True))
    ckpts = RUN / "checkpoints"
    start = 0
    if os.environ["ABLATE_RESUMED"] == "1":
        start = max(int(p.stem.split("_")[1]) for p in ckpts.glob("step_*.txt"))
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    print(f"cwd={os.getcwd()} start={start} resumed={os.environ['ABLATE_RESUMED']} gpus={gpus}", file=sys.stderr,
          flush=True)
    for step in range(start + 1, args.steps + 1):
        time.sleep(args.step_s)
        if args.crash_at is not None and step == args.crash_at:
            for i in range(60):  # more than the 50 lines a run shows, coloured as a terminal logger would
                print(f"\x1b[31mtrace line {i}\x1b[0m", file=sys.stderr)
            return 3
        if step % args.every == 0:
            name = f"checkpoints/step_{step:04d}.txt"
            (RUN / name).write_text(f"weights at {step}")
            line = {"step": step, "val_loss": 1.0 / step, "checkpoint": name, "resumed_from": start}
            if args.png:
                (RUN / "samples" / f"step_{step}").mkdir(parents=True, exist_ok=True)
                (RUN / "samples" / f"step_{step}" / "grid.png").write_bytes(png(step))
                line["recon_mse"] = step / 1000
            with open(os.environ["ABLATE_METRICS_FILE"], "a") as fh:
                fh.write(json.dumps(line) + "\n")
        if STOP.exists() and not args.ignore_stop:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
