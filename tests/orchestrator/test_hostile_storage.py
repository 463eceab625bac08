"""A hostile node's checkpoint storage prefix, read by the controller: the node writes what it likes into
the prefix it can write (a symbolic link to the controller's token, an HTML page named `recon_0.png`, a
PNG of hundreds of MB), and the sample route, the report and a sweep's copy-back refuse each one. On a
`file://` store shared with nodes and on a real OpenSSH server's `sftp://` store; a real migrated database."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from orchestrator.app import create_app
from orchestrator.db.models import Grid, Run
from orchestrator.db.session import session_scope
from orchestrator.results.reports.build import build_report
from orchestrator.results.reports.write import write_report
from orchestrator.results.samples import MAX_SAMPLE_BYTES
from orchestrator.runs.ingest import insert_metrics
from orchestrator.runs.storage import download_run
from orchestrator.settings import Settings

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = b"the-controller-s-api-token\n"
STEP_DIR = "samples/step_0000010"
NAMES = ("target_0.png", "recon_0.png", "text_0.png")


def png(side: int = 8) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (side, side), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def manifest_record() -> dict[str, Any]:
    files = [{"file": n, "kind": n.split("_")[0], "index": 0, "caption": "", "bytes": 1} for n in NAMES]
    return {"step": 10, "loss": 0.5, "samples": {"dir": STEP_DIR, "files": files, "max_side": 8}}


def hostile_prefix(prefix: Path, secret: Path) -> None:
    """What the node leaves: a real PNG, a link to the controller's secret, HTML named .png; and links
    among the run's own flat files."""
    (prefix / STEP_DIR).mkdir(parents=True)
    (prefix / STEP_DIR / "target_0.png").write_bytes(png())
    (prefix / STEP_DIR / "recon_0.png").symlink_to(secret)
    (prefix / STEP_DIR / "text_0.png").write_bytes(b"<html><script>alert(1)</script></html>")
    (prefix / "records.jsonl").symlink_to(secret)
    (prefix / "best.pt").write_bytes(b"weights")
    (prefix / "samples" / "step_0000020").symlink_to(secret.parent, target_is_directory=True)


@pytest.fixture
def client(database_url: str, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(database_url=database_url, home_dir=tmp_path), TOKEN)) as c:
        yield c


def run_on(client: TestClient, database_url: str, url: str) -> int:
    resp = client.post("/api/grids", json={"name": "hostile-storage", "arms": ["A"]}, headers=AUTH)
    grid = client.get(f"/api/grids/{resp.json()['id']}").json()
    run_id = grid["runs"][0]["id"]
    with session_scope(database_url) as session:
        insert_metrics(session, run_id, [manifest_record()])
        run = session.get_one(Run, run_id)
        run.checkpoint_url, run.checkpoint_dir, run.best_step = url, "/nonexistent/on-this-machine", 10
    return run_id


def assert_served_only_the_png(client: TestClient, database_url: str, run_id: int,
                               options: dict[str, Any] | None = None) -> None:  # fmt: skip
    good = client.get(f"/api/runs/{run_id}/samples/10/target_0.png")
    assert good.status_code == 200 and good.content == png()
    assert good.headers["x-content-type-options"] == "nosniff"
    link = client.get(f"/api/runs/{run_id}/samples/10/recon_0.png")
    assert link.status_code == 404 and SECRET not in link.content
    assert "symbolic link" in link.json()["detail"] or "outside" in link.json()["detail"], link.json()
    html = client.get(f"/api/runs/{run_id}/samples/10/text_0.png")
    assert html.status_code == 404 and "not a PNG" in html.json()["detail"], html.json()
    # Anyone may read samples: a refusal says why, never where the controller keeps the file.
    assert "/" not in link.json()["detail"] and "/" not in html.json()["detail"], (link.json(), html.json())
    with session_scope(database_url) as session:
        grid = session.get_one(Grid, session.get_one(Run, run_id).grid_id)
        images = {i.kind: i for i in build_report(session, grid, options).arms[0].samples.images}  # type: ignore[union-attr]
    assert images["target"].data_uri is not None
    assert images["recon"].data_uri is None and images["recon"].refused
    assert images["text"].data_uri is None and "not a PNG" in str(images["text"].refused)


def test_a_file_store_shared_with_nodes_serves_no_link_and_no_non_png(client, database_url, tmp_path) -> None:
    secret = tmp_path / "controller" / "token"
    secret.parent.mkdir()
    secret.write_bytes(SECRET)
    prefix = tmp_path / "store" / "run-1"
    hostile_prefix(prefix, secret)
    run_id = run_on(client, database_url, f"file://{prefix}")
    assert_served_only_the_png(client, database_url, run_id)

    skipped: list[str] = []
    local = tmp_path / "copied-back"
    download_run(f"file://{prefix}", {}, local, 1 << 20, skipped)
    copied = {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()}
    assert SECRET not in copied.values(), "copy-back followed a node's link"
    assert copied[f"{STEP_DIR}/target_0.png"] == png() and copied["best.pt"] == b"weights"
    assert any("records.jsonl" in s and "symbolic link" in s for s in skipped), skipped


def test_an_sftp_store_serves_no_link(sshd, database_url, tmp_path) -> None:  # noqa: ANN001
    secret = sshd.workdir / "controller-token"
    secret.write_bytes(SECRET)
    prefix = sshd.workdir / "store" / "run-2"
    hostile_prefix(prefix, secret)
    url = f"sftp://{sshd.user}@{sshd.host}:{sshd.port}{prefix}"
    options = {"key_filename": str(sshd.client_key), "known_hosts": str(sshd.known_hosts)}
    settings = Settings(database_url=database_url, home_dir=tmp_path, checkpoint_options=options)
    with TestClient(create_app(settings, TOKEN)) as client:
        run_id = run_on(client, database_url, url)
        assert_served_only_the_png(client, database_url, run_id, options)
    skipped: list[str] = []
    local = tmp_path / "copied-back"
    download_run(url, options, local, 1 << 20, skipped)
    assert SECRET not in [p.read_bytes() for p in local.rglob("*") if p.is_file()]
    assert any("symbolic link" in s for s in skipped), skipped


def test_an_sftp_store_refuses_a_parent_directory_that_is_a_link(sshd, tmp_path) -> None:  # noqa: ANN001
    """A step directory swapped for a link (here into the prefix itself, which resolving and checking the
    real path lets through) is refused: every component is lstat'ed on the way down."""
    from worker.checkpoint_store import open_fs
    from worker.stored_file import StoredFileRefused, read_stored

    prefix = sshd.workdir / "store" / "run-3"
    (prefix / STEP_DIR).mkdir(parents=True)
    (prefix / STEP_DIR / "target_0.png").write_bytes(png())
    (prefix / "samples" / "step_0000030").symlink_to(prefix / STEP_DIR, target_is_directory=True)
    options = {"key_filename": str(sshd.client_key), "known_hosts": str(sshd.known_hosts)}
    fs, root = open_fs(f"sftp://{sshd.user}@{sshd.host}:{sshd.port}{prefix}", options)
    assert read_stored(fs, root, f"{root}/{STEP_DIR}/target_0.png", 1 << 20) == png()
    with pytest.raises(StoredFileRefused, match="symbolic link"):
        read_stored(fs, root, f"{root}/samples/step_0000030/target_0.png", 1 << 20)


def test_sizes_are_the_controller_s_not_the_node_s(client, database_url, tmp_path) -> None:
    prefix = tmp_path / "store" / "run-3"
    (prefix / STEP_DIR).mkdir(parents=True)
    big = png() + b"\0" * MAX_SAMPLE_BYTES  # a "PNG" over the cap (sparse on disk: cheap to make)
    (prefix / STEP_DIR / "target_0.png").write_bytes(big)
    (prefix / STEP_DIR / "recon_0.png").write_bytes(png())
    (prefix / "ckpt_0000010.pt").write_bytes(b"w" * 4096)
    run_id = run_on(client, database_url, f"file://{prefix}")
    over = client.get(f"/api/runs/{run_id}/samples/10/target_0.png")
    assert over.status_code == 404 and f"over {MAX_SAMPLE_BYTES} bytes" in over.json()["detail"]
    assert client.get(f"/api/runs/{run_id}/samples/10/recon_0.png").status_code == 200

    skipped: list[str] = []
    local = tmp_path / "copied-back"
    download_run(f"file://{prefix}", {}, local, 4096 + len(png()), skipped)  # the checkpoint and one PNG
    assert sum(p.stat().st_size for p in local.rglob("*") if p.is_file()) <= 4096 + len(png())
    assert not list(local.rglob("*.fetch")), "a refused copy leaves nothing behind"
    assert any("over" in s for s in skipped), skipped


@pytest.mark.parametrize("field", ["index", "max_side"])
def test_one_malformed_samples_manifest_is_left_out_not_a_500(client, database_url, tmp_path, field) -> None:
    prefix = tmp_path / "store" / "run-4"
    (prefix / STEP_DIR).mkdir(parents=True)
    for name in NAMES:
        (prefix / STEP_DIR / name).write_bytes(png())
    run_id = run_on(client, database_url, f"file://{prefix}")
    bad = manifest_record() | {"step": 20}
    if field == "index":
        bad["samples"]["files"][0]["index"] = "x"
    else:
        bad["samples"]["max_side"] = "x"
    with session_scope(database_url) as session:
        insert_metrics(session, run_id, [bad])
        grid_id = session.get_one(Run, run_id).grid_id
    dashboard = client.get(f"/api/dashboard/grids/{grid_id}")
    assert dashboard.status_code == 200, dashboard.text
    [run] = [r for r in dashboard.json()["runs"] if r["id"] == run_id]
    assert run["samples"]["steps"] == [10] and run["samples"]["malformed"] == [20]
    for fmt in ("json", "html", "md"):
        assert client.get(f"/api/grids/{grid_id}/report.{fmt}").status_code == 200, fmt
    assert [s["step"] for s in client.get(f"/api/runs/{run_id}/samples").json()] == [10]
    with session_scope(database_url) as session:  # the report written when a grid ends
        paths = write_report(session, session.get_one(Grid, grid_id), tmp_path / "report")
    assert all(Path(p).is_file() for p in paths)
