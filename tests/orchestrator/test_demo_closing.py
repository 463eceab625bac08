"""The demo's last lines say that its links end with it and how to keep them up (`--hold`)."""

from __future__ import annotations

from orchestrator.cli.demo import closing_lines

URL = "http://127.0.0.1:8765/"


def test_without_hold_the_demo_names_hold_before_its_links_die() -> None:
    lines = closing_lines(URL, 7, hold=False)
    assert lines[0].endswith(f"{URL}api/grids/7/report.html")
    assert "end with this command" in lines[-1] and "ablate demo --hold" in lines[-1] and "ablate report 7" in lines[-1]


def test_with_hold_it_says_it_keeps_serving() -> None:
    assert closing_lines(URL, 7, hold=True)[-1] == "serving the dashboard; Ctrl-C to end"
