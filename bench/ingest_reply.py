"""How fast the controller takes in one maximal poll reply: records per second, end to end.

A maximal reply is what a node may send at most: RECORDS_PER_POLL records, each with every metric column,
MAX_FALLBACKS fallback notes and padding up to the 16 MiB reply cap. The bench times what the launcher
does with it: parse the line (agent_link.parse_reply), validate it (worker/protocol.py PollResult), check the records
(refused_records, refused_metrics), and store them with the detector judging every new checkpoint against
the control arm (ingest), committed. `--history N` first stores N earlier checkpoints of the same run, to
show the time per record does not grow with the series.

    python bench/ingest_reply.py [--history 0] [--database-url sqlite:///...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any


def record(step: int, run_id: int, notes: int, pad: int) -> dict[str, Any]:
    return {
        "step": step, "run_id": run_id, "train_loss": 0.3, "grad_norm": 1.2, "lr": 1e-4,
        "recon_lpips": 0.5 - step * 1e-6, "recon_lpips_se": 0.01, "recon_lpips_n": 64,
        "text_lpips": 0.4, "text_lpips_se": 0.01, "text_lpips_n": 64, "text_manip_delta": 0.1,
        "val_flow_loss": 0.9, "val_flow_loss_se": 0.02, "val_flow_loss_n": 64, "iter_per_sec": 3.0,
        "samples_per_sec": 96.0, "tokens_per_sec": 24576.0, "peak_memory_gb": 20.0, "wall_time_s": step * 0.3,
        "gpu_hours": step * 1e-4, "lpips_backbone": "alexnet", "checkpoint": f"/node/ckpt_{step:07d}.pt",
        "fallbacks": [f"fallback {i}: " + "x" * 400 for i in range(notes)], "pad": "p" * pad,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--history", type=int, default=0, help="checkpoints stored before the reply")
    parser.add_argument("--database-url", help="default: a fresh SQLite file")
    args = parser.parse_args()

    from orchestrator.db.models import Run
    from orchestrator.db.session import session_scope, upgrade
    from orchestrator.fleet.agent_link import parse_reply
    from orchestrator.grids.service import GridCreate, create_grid
    from orchestrator.runs.ingest import MAX_FALLBACKS, ingest, last_step, refused_metrics
    from worker.protocol import MAX_REPLY_BYTES, PollResult, refused_records
    from worker.run_files import RECORDS_PER_POLL
    from worker.worker_names import worker_name

    url = args.database_url or f"sqlite:///{Path(tempfile.mkdtemp()) / 'bench.db'}"
    upgrade(url)
    overrides = {"schedule": {"steps": 10**7}, "detector": {"metric": "recon_lpips"}}
    with session_scope(url) as session:
        grid = create_grid(session, GridCreate(name="ingest-bench", arms=["A", "B"], overrides=overrides))
        control, arm = (r.id for r in grid.runs)
        session.flush()
        ingest(session, session.get_one(Run, control), [record(s, control, 0, 0) for s in range(1, 2001)])
        run = session.get_one(Run, arm)
        for start in range(1, args.history + 1, RECORDS_PER_POLL):
            ingest(session, run, [record(s, arm, 0, 0) for s in range(start, min(start + RECORDS_PER_POLL,
                                                                                   args.history + 1))])
    first = args.history + 1
    name = worker_name(arm, 0)
    one = len(json.dumps(record(first, arm, MAX_FALLBACKS, 0)))
    pad = max(0, (MAX_REPLY_BYTES - 4096) // RECORDS_PER_POLL - one - 16)
    records = [record(first + i, arm, MAX_FALLBACKS, pad) for i in range(RECORDS_PER_POLL)]
    reply = {"runs": {name: {"state": "running", "info": {"pid": 1}, "records": records}}}
    line = json.dumps({"id": 1, "ok": True, "result": reply}).encode()
    assert len(line) <= MAX_REPLY_BYTES, len(line)

    t0 = time.perf_counter()
    parsed = parse_reply(line)
    got = PollResult.model_validate(parsed["result"]).runs[name]
    t1 = time.perf_counter()
    values = [r.values() for r in got.records]
    refused = refused_records(got.records, arm, args.history or None) or refused_metrics(values)
    assert refused is None, refused
    t2 = time.perf_counter()
    with session_scope(url) as session:
        new = ingest(session, session.get_one(Run, arm), values)
    t3 = time.perf_counter()
    with session_scope(url) as session:
        assert len(new) == RECORDS_PER_POLL and last_step(session, arm) == first + RECORDS_PER_POLL - 1
    total = t3 - t0
    print(json.dumps({
        "records": RECORDS_PER_POLL, "reply_bytes": len(line), "history": args.history,
        "database": url.split(":", 1)[0], "parse_validate_s": round(t1 - t0, 3), "checks_s": round(t2 - t1, 3),
        "ingest_s": round(t3 - t2, 3), "total_s": round(total, 3), "records_per_s": round(RECORDS_PER_POLL / total),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
