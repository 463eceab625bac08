"""The shared DiT core. Imports nothing from orchestrator/ or worker/."""
