"""The shared DiT core. Imports nothing from orchestrator/ or worker/.

The arm spec (`spec`, with `command_spec` for command arms and `strict` for its forbid-unknown-keys base),
the model (`nanodit`), flow matching and AsymFlow (`flow`), REPA (`repa`), the optimizers and EMA (`optim`),
precision (`precision`), the text encoder (`text`), LPIPS (`perceptual`), evaluation (`evaluate`),
pretrained-weight downloads (`hub`) and the data (`data/`). `spec` and what it imports are free of torch:
the controller imports them at start-up.
"""
