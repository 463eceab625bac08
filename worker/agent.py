"""The node agent: the one process through which the controller drives a node's arms, in JSON.

The controller starts it over the node's SSH connection (a rented or registered node) or as its own
child process (its own machine), and they talk one JSON object per line: the controller writes a
request on the agent's stdin, the agent answers on its stdout. The agent is a Ray driver of the node's
own Ray (worker/node_ray.py): it starts, polls, stops and kills the node's arm workers (named, detached
actors with the GPUs each arm asks for: Ray sets CUDA_VISIBLE_DEVICES) and hands their records on as JSON.
Nothing the controller receives is a pickle, and nothing of the controller's (its database, keys, Ray) is reachable
from the node. When the controller goes away (its SSH channel or pipe closes) the agent exits and the
workers train on; the next controller's agent finds them again by name.

What it is asked and what it answers is the node protocol, worker/protocol.py: the ops (hello, start,
poll, stop, kill, ping), their request and reply models, the worker-name rule. The agent imports it where
it serves requests, never at its own import: `--help`, start-head and stop-head run on a node whose
environment (pydantic included) is not installed yet.

    python -m worker.agent serve --namespace NS [--ray-dir DIR | --address ADDR | --local-gpus N]
    python -m worker.agent start-head --ray-dir DIR [--num-gpus N]
    python -m worker.agent stop-head --ray-dir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from worker.node_ray import TOKEN_FILE, auth_env, register_agent, start_head, stop_session_dir

if TYPE_CHECKING:  # names for annotations only: pydantic is imported where requests are served
    from worker.protocol import (
        Found,
        Hello,
        HelloRequest,
        KillRequest,
        PingRequest,
        PollRequest,
        Started,
        StartRequest,
        StopRequest,
    )



class Agent:
    """The node's arm workers, driven by requests; `handle(request)` answers one."""

    def __init__(self, namespace: str) -> None:
        from worker.protocol import Op

        self.namespace = namespace
        self.handles: dict[str, Any] = {}
        self.pending: dict[str, Any] = {}  # name -> the poll in flight (answered on a later request)
        # The protocol's ops, each to its method: the one place a request meets its handler.
        self.ops: dict[Op, Callable[[Any], Any]] = {
            Op.hello: self.hello,
            Op.start: self.start,
            Op.poll: self.poll,
            Op.stop: self.stop,
            Op.kill: self.kill,
            Op.ping: self.ping,
        }

    def handle(self, request: Any) -> Any:
        """The result of one request (a JSON object), checked against the protocol's request models first."""
        from worker.protocol import REQUEST

        checked = REQUEST.validate_python(request)
        return self.ops[checked.op](checked)

    def _actor(self, name: str) -> Any:
        import ray

        if name not in self.handles:
            try:
                self.handles[name] = ray.get_actor(name, namespace=self.namespace)
            except ValueError:
                return None
        return self.handles[name]

    def hello(self, request: HelloRequest) -> Hello:
        import ray

        from worker.protocol import PROTOCOL, Hello
        from worker.worker_names import WORKER_PREFIXES

        names = [n for n in ray.util.list_named_actors() if n.startswith(WORKER_PREFIXES)]
        return Hello(
            protocol=PROTOCOL,
            node=socket.gethostname(),
            gpus=int(ray.cluster_resources().get("GPU", 0)),
            workers=sorted(names),
        )

    def start(self, request: StartRequest) -> Started:
        import ray

        from worker.actor import ArmWorker
        from worker.protocol import Started

        if self._actor(request.name) is not None:
            return Started(adopted=True)
        args = request.args
        self.handles[request.name] = (
            ray.remote(ArmWorker)
            .options(
                name=request.name,
                namespace=self.namespace,
                lifetime="detached",
                num_gpus=args.spec.gpu_count(),  # N GPUs of this node (Ray lists them in CUDA_VISIBLE_DEVICES)
                num_cpus=0,  # four arms run at once on a node whatever its core count
                max_concurrency=4,  # poll and request_stop run beside the training thread
                max_restarts=0,  # a lost worker is retried by the controller, from its checkpoint
            )
            .remote(**dict(args))  # the spec as the validated ArmSpec: the worker trains it as it is
        )
        return Started(adopted=False)

    def poll(self, request: PollRequest) -> dict[str, Any]:
        """{"runs": {name: the worker's poll reply, or {"state": "lost", "error"}}} (protocol PollResult)."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        out: dict[str, Any] = {}
        for name, after in request.runs.items():
            if name in self.pending:
                continue
            actor = self._actor(name)
            if actor is None:
                out[name] = {"state": "lost", "error": f"no worker {name} on this node"}
                continue
            self.pending[name] = actor.poll.remote(after, request.wait_s)
        asked = [n for n in request.runs if n in self.pending]
        refs = [self.pending[n] for n in asked]
        if refs:
            ray.wait(refs, num_returns=1, timeout=request.wait_s + 1.0)
            ready = {r.hex() for r in ray.wait(refs, num_returns=len(refs), timeout=0)[0]}
            for name in asked:
                if self.pending[name].hex() not in ready:
                    continue
                ref = self.pending.pop(name)
                try:
                    out[name] = ray.get(ref)
                except ActorUnavailableError:  # transient: asked again on the next poll
                    continue
                except RayActorError as exc:
                    self.handles.pop(name, None)
                    text = str(exc).strip()
                    out[name] = {"state": "lost", "error": text.splitlines()[0] if text else type(exc).__name__}
        return {"runs": out}

    def stop(self, request: StopRequest) -> Found:
        from worker.protocol import Found

        actor = self._actor(request.name)
        if actor is not None:
            actor.request_stop.remote()
        return Found(found=actor is not None)

    def kill(self, request: KillRequest) -> Found:
        import ray

        from worker.protocol import Found

        actor = self._actor(request.name)
        self.handles.pop(request.name, None)
        self.pending.pop(request.name, None)
        if actor is not None:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        return Found(found=actor is not None)

    def ping(self, request: PingRequest) -> dict[str, Any]:
        """The worker's process info (protocol WorkerInfo)."""
        import ray

        actor = self._actor(request.name)
        if actor is None:
            raise ValueError(f"no worker {request.name} on this node")
        return ray.get(actor.ping.remote(), timeout=60)


def serve(agent: Agent, stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Answer requests until stdin closes (the controller went away: the workers train on)."""
    from pydantic import BaseModel, ValidationError

    from worker.protocol import MAX_REQUEST_BYTES, first_error, jsonable

    while True:
        line = stdin.readline(MAX_REQUEST_BYTES + 1)
        if not line:
            return
        request_id = None
        try:
            if len(line) > MAX_REQUEST_BYTES:
                raise ValueError(f"request over {MAX_REQUEST_BYTES} bytes")
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            request_id = request.get("id")
            result = agent.handle(request)
            result = result.model_dump(mode="json") if isinstance(result, BaseModel) else jsonable(result)
            reply = {"id": request_id, "ok": True, "result": result}
        except ValidationError as exc:  # a request the protocol does not know
            reply = {"id": request_id, "ok": False, "error": f"invalid request: {first_error(exc)}"[:2000]}
        except Exception as exc:  # noqa: BLE001 - answered, the agent serves on
            reply = {"id": request_id, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        stdout.write(json.dumps(reply).encode() + b"\n")
        stdout.flush()


def connect(namespace: str, ray_dir: Path | None, address: str | None, local_gpus: int | None) -> None:
    """Join the node's Ray: the head recorded in ray_dir (started if down, e.g. after a reboot), a given
    address, or a Ray of this process's own (the controller's machine, when it names none)."""
    if ray_dir is not None:
        address = start_head(ray_dir, None)
        os.environ.update(auth_env(ray_dir.resolve() / TOKEN_FILE))
    import ray

    kwargs: dict[str, Any] = {"namespace": namespace, "log_to_driver": False, "logging_level": "WARNING"}
    if address is not None:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_gpus=local_gpus or None, include_dashboard=False, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.agent", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("serve", help="answer the controller's requests on stdin/stdout")
    run.add_argument("--namespace", required=True)
    run.add_argument("--ray-dir", type=Path, help="the node's own Ray head (started if it is down)")
    run.add_argument("--address", help="a Ray to join instead (the controller's machine)")
    run.add_argument("--local-gpus", type=int, help="start a Ray of this process's own with N logical GPUs")
    head = sub.add_parser("start-head", help="start the node's Ray head (idempotent)")
    head.add_argument("--ray-dir", type=Path, required=True)
    head.add_argument("--num-gpus", type=int, help="logical GPUs to declare (default: Ray detects them)")
    stop = sub.add_parser("stop-head", help="end exactly the node's Ray session")
    stop.add_argument("--ray-dir", type=Path, required=True)
    # A head's GCS sits out SIGTERM's whole grace before it exits; by the time a node's Ray is stopped its
    # arms are done or re-queued from storage, so 15 s per node bought nothing but a slower teardown.
    stop.add_argument("--grace", type=float, default=3.0, help="seconds between SIGTERM and SIGKILL")
    args = parser.parse_args(argv)
    if args.action == "start-head":
        print(start_head(args.ray_dir, args.num_gpus))
        return 0
    if args.action == "stop-head":
        pids = stop_session_dir(args.ray_dir.resolve(), args.grace)
        print(f"stopped {len(pids)} processes of the node's Ray session")
        return 0
    # The protocol owns the real stdout; anything else printed (Ray, a library) goes to stderr.
    protocol_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    mark = register_agent(args.ray_dir.resolve()) if args.ray_dir is not None else None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop-head: end as if stdin closed
    try:
        connect(args.namespace, args.ray_dir, args.address, args.local_gpus)
        serve(Agent(args.namespace), sys.stdin.buffer, protocol_out)
    finally:
        if mark is not None:
            mark.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
