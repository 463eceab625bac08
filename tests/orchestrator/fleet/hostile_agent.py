"""A hostile node agent, for the tests of what the controller believes (tests/orchestrator/fleet/test_hostile_*.py).

    python hostile_agent.py MODE [ARG]

It answers hello, start (any name), stop and kill with well-formed JSON; MODE picks what its polls send.
Lies in valid replies (what the controller must not believe):

    quiet           polls: running, no records (the honest baseline)
    foreign         hello names the workers in ARG (comma-separated), which it was never given
    gpus            hello claims ARG GPUs
    lpips-lie       a record with recon_lpips -1e300
    negative-loss   a record with train_loss -3
    step-cap        a record at step 2**40
    flood           ARG + 1 records in one reply (ARG: the controller's cap)
    fallbacks       one record with ARG fallback notes
    forged-KIND     a storage-log entry of event kind KIND (started, rented.replacement, ...)
    storage-flood   ARG storage-log entries in one reply
    storage-data    a checkpoint.stored entry whose data carries a key of another event (node_name)
    silent          polls are never answered
    deep            a poll reply nested 100,000 deep
    bigint          a poll reply with an integer of 5,000 digits
    other-run       a record that names another run
    label           a CMMD whose extractor label is 1,000,075 characters of HTML and markdown (issue 63)
    other-reference a CMMD scored against reference features of sha256 ARG (64 hex digits; issue 63)
    error-text      the worker failed, with ARG as its error (escape sequences, say)

Replies that break the protocol (ARG: a canary file that appears only if something the node sent ran):

    pickle          a pickle whose unpickling would create the canary
    malformed       JSON cut off mid-object
    huge            a reply over the size limit
    traversal       a reply naming the worker "../../etc/passwd"
    endless         a reply begun and never ended, sent as fast as the pipe takes it
    trickle         the same, one byte every 50 ms (under the size limit: only a deadline ends it)

The standard library only: it runs under any python3, over pipes or as a node's `agent` over SSH.
"""

import json
import os
import pickle
import sys
import time

mode, arg = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")


class Payload:
    """Unpickled, it would touch the canary file (ARG)."""

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {arg}",))


def send(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def reply(req: dict, result: object) -> None:
    send(json.dumps({"id": req["id"], "ok": True, "result": result}).encode() + b"\n")


def worker_reply(name: str) -> dict:
    run_id = int(name.split("-")[2])
    out = {"state": "running", "info": {"pid": 1, "node": "liar"}, "records": [], "stopping": False}
    record = {"step": 1, "run_id": run_id, "train_loss": 0.5}
    if mode == "lpips-lie":
        out["records"] = [{**record, "recon_lpips": -1e300}]
    elif mode == "negative-loss":
        out["records"] = [{**record, "train_loss": -3.0}]
    elif mode == "step-cap":
        out["records"] = [{**record, "step": 2**40}]
    elif mode == "flood":
        out["records"] = [{**record, "step": step} for step in range(1, int(arg) + 2)]
    elif mode == "fallbacks":
        out["records"] = [{**record, "fallbacks": [f"note {i}" for i in range(int(arg))]}]
    elif mode == "other-run":
        out["records"] = [{**record, "run_id": run_id + 1000}]
    elif mode in ("label", "other-reference"):
        label = "clip-vit-l-14-336 small random stand-in (no weights)"
        if mode == "label":  # a tag, a remote image, and bulk: the 1,000,075 characters
            label = '<img src=x onerror="alert(1)">![p](https://attacker.example/p.png)'
            label += "A" * (1_000_075 - len(label))
        cmmd = {"cmmd": 5.0, "cmmd_se": 0.1, "cmmd_n": 8, "cmmd_samples": [5.0] * 8, "cmmd_extractor": label}
        out["records"] = [{**record, **cmmd, "distribution_sha256": {label[:200]: arg or "a" * 64}}]
    elif mode == "error-text":
        out.update(state="error", error=arg)
    elif mode.startswith("forged-") or mode in ("storage-flood", "storage-data"):
        kind = mode.removeprefix("forged-") if mode.startswith("forged-") else "checkpoint.stored"
        data = {"step": 1, "node_name": "elsewhere"} if mode == "storage-data" else {"step": 1}
        count = int(arg) if mode == "storage-flood" else 1
        log = [{"seq": i, "time": "t", "kind": kind, "message": "m", "data": data} for i in range(1, count + 1)]
        out["storage"] = {"stored_step": None, "failures": 0, "log": log}
    return out


for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "hello":
        workers = arg.split(",") if mode == "foreign" else []
        reply(req, {"protocol": 2, "node": "liar", "gpus": int(arg) if mode == "gpus" else 1, "workers": workers})
    elif req["op"] != "poll":
        reply(req, {"adopted": False} if req["op"] == "start" else {"found": True})
    elif mode == "silent":
        continue  # it reads on (and ends with its stdin) but never answers a poll
    elif mode == "deep":
        send(b'{"id": %d, "ok": true, "result": ' % req["id"] + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    elif mode == "bigint":
        send(b'{"id": %d, "ok": true, "result": {"runs": {}, "n": %s}}\n' % (req["id"], b"7" * 5000))
    elif mode == "pickle":
        send(pickle.dumps(Payload()) + b"\n")
    elif mode == "malformed":
        send(b'{"id": %d, "ok": true, "result": {"runs": {\n' % req["id"])
    elif mode == "huge":
        reply(req, {"runs": {name: {**worker_reply(name), "error": "x" * (17 << 20)} for name in req["runs"]}})
    elif mode == "traversal":
        reply(req, {"runs": {"../../etc/passwd": worker_reply(next(iter(req["runs"]))), **{
            name: worker_reply(name) for name in req["runs"]}}})
    elif mode in ("endless", "trickle"):
        send(b'{"id": %d, "ok": true, "result": ' % req["id"])
        while True:
            if mode == "endless":
                send(b"[" * 65536)
            else:
                send(b"[")
                time.sleep(0.05)
    else:
        reply(req, {"runs": {name: worker_reply(name) for name in req["runs"]}})
