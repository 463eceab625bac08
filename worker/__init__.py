"""What runs on a node; imports model/, never orchestrator/.

The agent and its contract with the controller (`agent`, `protocol`), the node's own Ray (`node_ray`), the
actor that trains one arm (`actor`) and a command arm's process (`command`, with `command_client` for the
researcher's script and `folder_mirror` for its checkpoints/ folder), the training loop (`train`; its parts:
`train_parts`; its checkpoint record: `train_record`), an arm's ranks on several GPUs (`ranks`, `world`),
the micro-batch choice (`micro_batch`), checkpoints and samples (`checkpoint`, `samples`), uploads to
checkpoint storage (`checkpoint_store`), data and compile caches (`data_fetch`, `compile_cache`), error
descriptions (`failure`), and the torch-free modules the controller imports: the run directory's file names
(`run_files`) and reading a file from checkpoint storage that a node may have written (`stored_file`).
"""
