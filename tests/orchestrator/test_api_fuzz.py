"""Fuzz every operation from the app's own OpenAPI schema: no input may produce a 5xx.

With the token the generated bodies reach the grid service and the database (Postgres in CI,
where NUL bytes, out-of-range integers and non-finite floats are rejected by the server, not
silently coerced); without it they exercise the auth path.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from orchestrator.app import create_app
from orchestrator.settings import Settings

TOKEN = "fuzz-token"


# Built at import so schemathesis can read the schema; the database is attached per module below.
app = create_app(Settings(), TOKEN)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module", autouse=True)
def _use_test_database(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    # Routes read the settings from app.state on every request, so this points them at the test DB.
    app.state.settings = Settings(database_url=database_url, home_dir=tmp_path_factory.mktemp("storage"))


FUZZ = settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@schema.parametrize()
@FUZZ
def test_no_server_error_with_token(case: schemathesis.Case) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, checks=[not_a_server_error])


@schema.parametrize()
@FUZZ
def test_no_server_error_without_token(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error])
