"""A command arm's section of the arm spec: the researcher's own trainer, run instead of ablate's
(worker/command.py runs it; docs/your-trainer.md is the contract). Imports no torch."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from model.strict import Strict

# Seconds a command arm has to exit after its stop file appears (then SIGTERM; SIGKILL KILL_AFTER_TERM_S later).
STOP_GRACE_S = 60.0
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
ArgText = Annotated[str, Field(min_length=1, max_length=4096)]
MAX_ARM_GPUS = 16  # GPUs of one node an arm may ask for (the largest nodes rented hold 8)


# What ended a command arm's process, as its run records it (worker/command.py decides, the launcher words it).
CommandEnd = Literal["exit", "stop_file", "sigterm", "sigkill"]
COMMAND_ENDS: dict[str, str] = {
    "exit": "the command exited by itself",
    "stop_file": "the command exited after its stop file",
    "sigterm": "the command outlived its stop file's grace period and ended on SIGTERM",
    "sigkill": "the command outlived SIGTERM and was killed (SIGKILL)",
}
# After SIGTERM, how long a command arm has before SIGKILL (its default term_grace_s).
KILL_AFTER_TERM_S = 30.0


class CommandSpec(Strict):
    """A researcher's own trainer run as the arm instead of ablate's (worker/command.py runs it).

    The grid names it as {"name", "code", "command": [...], "env", "gpus", "stop_grace_s"}; the run stores
    it here, so a node starts it exactly as it was accepted. docs/your-trainer.md is the contract.
    """

    code: Annotated[str, Field(min_length=1, max_length=4096)]  # absolute directory, copied as the working dir
    argv: Annotated[list[ArgText], Field(min_length=1, max_length=256)]  # no shell: argv[0] is the program
    env: dict[Annotated[str, Field(pattern=ENV_NAME, max_length=256)], Annotated[str, Field(max_length=65536)]] = (
        Field(default_factory=dict)
    )
    # GPUs of one node, all listed in the command's CUDA_VISIBLE_DEVICES (Ray pins them); running
    # several ranks over them (torchrun) is the command's own business (docs/your-trainer.md).
    gpus: Annotated[int, Field(gt=0, le=MAX_ARM_GPUS)] = 1
    # Long enough to write a final checkpoint of a seed-size model; a day at most (a hung trainer is killed).
    stop_grace_s: Annotated[float, Field(ge=0, le=86400)] = STOP_GRACE_S
    # SIGTERM to SIGKILL: time for a SIGTERM handler to save (W&B's agent has WANDB_AGENT_KILL_DELAY for it).
    term_grace_s: Annotated[float, Field(ge=0, le=3600)] = KILL_AFTER_TERM_S
