"""A grid file that is not YAML is refused in one line that says where: the line and column, and what broke."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import CLIError
from orchestrator.cli.core import load_grid_file


def test_a_grid_file_that_is_not_yaml_names_its_line_and_column(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("name: x\narms: [A, B\nseeds: 2\n")
    with pytest.raises(CLIError) as refused:
        load_grid_file(grid)
    message = str(refused.value)
    assert message == (f"{grid} is not valid YAML: line 3, column 6: expected ',' or ']', but got ':' "
                       "(while parsing a flow sequence from line 2)"), message  # fmt: skip
