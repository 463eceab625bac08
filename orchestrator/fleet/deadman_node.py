"""The dead-man's switch as it runs ON a rented node: standard library only, copied there over SFTP by
orchestrator/fleet/deadman.py and started with the node's Python before anything else is installed.

    python .ablate-deadman.py --deadline EPOCH --provider vast --instance ID --api-url URL --command CMD

It detaches into its own session (so the SSH session that started it can end), sleeps until the
deadline, then ends the node in two ways, each logged to ~/.ablate-deadman.log:
1. through the provider's API with the instance's OWN key, where the provider gives the instance one
   (Vast: CONTAINER_API_KEY with CONTAINER_ID; RunPod: RUNPOD_API_KEY with RUNPOD_POD_ID, "limited in
   scope to only the pod"), read from this process's environment or the container's PID 1;
   never the account's key, which never reaches a node;
2. then `--command` (default `sudo -n poweroff || poweroff || shutdown -h now`): on a machine the
   provider ends when it stops, that ends the billing for compute; on the test bed it touches a file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

# provider -> (variable with the instance id, variable with the key scoped to that instance)
SCOPED = {"vast": ("CONTAINER_ID", "CONTAINER_API_KEY"), "runpod": ("RUNPOD_POD_ID", "RUNPOD_API_KEY")}
HOME = os.path.expanduser("~")
PID_FILE = os.path.join(HOME, ".ablate-deadman.pid")
LOG_FILE = os.path.join(HOME, ".ablate-deadman.log")


def instance_env(names: tuple[str, str]) -> dict[str, str]:
    """The variables from this environment, else from PID 1's (a container's: SSH sessions lack them)."""
    found = {n: os.environ[n] for n in names if os.environ.get(n)}
    if len(found) < len(names):
        try:
            with open("/proc/1/environ", "rb") as fh:
                pairs = [p.split(b"=", 1) for p in fh.read().split(b"\0") if b"=" in p]
            found.update({k.decode(): v.decode() for k, v in pairs if k.decode() in names and v})
        except OSError:
            pass
    return found


def destroy_self(provider: str, instance_id: str, api_url: str) -> str:
    """End this instance through the provider's API with its own scoped key; what happened, in words."""
    if provider not in SCOPED:
        return f"provider {provider!r} gives no instance-scoped key"
    id_var, key_var = SCOPED[provider]
    env = instance_env(SCOPED[provider])
    if key_var not in env:
        return f"no {key_var} on this instance"
    if env.get(id_var) != instance_id:
        return f"{id_var} is {env.get(id_var)!r}, not {instance_id!r}: refusing"
    headers = {"Authorization": f"Bearer {env[key_var]}", "Content-Type": "application/json"}
    if provider == "vast":
        req = urllib.request.Request(f"{api_url}/api/v0/instances/{instance_id}/", method="DELETE", headers=headers)
    else:
        query = f'mutation {{ podTerminate(input: {{ podId: "{instance_id}" }}) }}'
        body = json.dumps({"query": query}).encode()
        req = urllib.request.Request(f"{api_url}/graphql", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return f"{provider} API with {key_var}: HTTP {resp.status} {resp.read(300).decode(errors='replace')}"
    except Exception as exc:  # noqa: BLE001 - whatever failed, the stop command still runs
        return f"{provider} API with {key_var} failed: {type(exc).__name__}: {str(exc)[:300]}"


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}", flush=True)


def detach() -> None:
    """Become a daemon in its own session; the starting process prints the daemon's pid and exits 0
    once the pid file is written, so the installer knows the switch is armed."""
    read, write = os.pipe()
    if os.fork():
        os.close(write)
        pid = os.read(read, 32).decode().strip()
        print(pid if pid else "the switch did not start", flush=True)
        os._exit(0 if pid else 1)
    os.close(read)
    os.setsid()
    if os.fork():
        os._exit(0)
    with open(PID_FILE, "w") as fh:
        fh.write(str(os.getpid()))
    out = os.open(LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.write(write, str(os.getpid()).encode())
    os.close(write)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deadline", type=float, required=True, help="epoch seconds")
    ap.add_argument("--provider", required=True)
    ap.add_argument("--instance", required=True)
    ap.add_argument("--api-url", required=True)
    ap.add_argument("--command", required=True)
    args = ap.parse_args()
    detach()
    log(f"armed: {args.provider} instance {args.instance} ends at {time.ctime(args.deadline)}")
    while (left := args.deadline - time.time()) > 0:
        time.sleep(min(left, 60.0))
    log(f"deadline passed: {destroy_self(args.provider, args.instance, args.api_url)}")
    log(f"running the stop command: {args.command}")
    done = subprocess.run(args.command, shell=True, check=False)
    log(f"the stop command exited {done.returncode}")
    sys.exit(0)


if __name__ == "__main__":
    main()
