"""Declarative arm specs A..I (one YAML file each) and the demo grid, shipped as package data."""

from pathlib import Path

ARMS_DIR = Path(__file__).parent
