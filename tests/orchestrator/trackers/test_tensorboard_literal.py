"""Node-supplied text (an extractor label, an event's message, a decision's reason, a caption) reaches
TensorBoard's Text tab as typed, never rendered: each is a Markdown code block no backtick in the text can
close. Real event files, read back with TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path

from orchestrator.trackers.base import Note, Point, Status, TrackedRun
from orchestrator.trackers.tensorboard_sink import TensorBoardSink
from tests.orchestrator.trackers.tracker_files import tensorboard_runs, unfenced

HOSTILE = '<img src="https://evil.example/x.png"> ![pixel](https://evil.example/p.png) ```\n# heading\n````` [a](b)'


def test_node_text_is_a_code_block_no_backtick_in_it_closes(tmp_path: Path) -> None:
    sink = TensorBoardSink(tmp_path)
    sink.open(TrackedRun(run_id=1, arm="A", grid_id=1, grid_name="g", spec={}, external_id=None, group_id=None))
    sink.checkpoint(1, Point(step=10, scalars={"train_loss": 1.0}, judged_metric="val_flow_loss",
                             labels={"cmmd_extractor": HOSTILE}))  # fmt: skip
    sink.status(1, Status(state="completed", decision="collapse", decision_step=10, decision_reason=HOSTILE,
                          best_step=None, best_value=None, judged_metric=None, ended=True,
                          notes=(Note(kind="stopped", message=HOSTILE, step=10),)))  # fmt: skip
    (acc,) = tensorboard_runs(tmp_path).values()
    written = {tag: acc.Tensors(f"{tag}/text_summary")[0].tensor_proto.string_val[0].decode()
               for tag in ("cmmd_extractor", "events/stopped", "decision")}  # fmt: skip
    for tag, text in written.items():
        fence = text.split("\n")[0]
        assert set(fence) == {"`"} and len(fence) == 6 and text.endswith("\n" + fence), (tag, text)
        assert fence not in unfenced(text)  # the longest backtick run inside is shorter than the fence
        assert HOSTILE in unfenced(text), tag
