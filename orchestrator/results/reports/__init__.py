"""The morning-after report of a grid: what each arm changed, its effect against its parent and the
control with intervals, the detector's stops, throughput and cost, samples; as JSON, Markdown and
self-contained HTML. `build` gathers it from the database, `effects` and `stats` compute the comparisons,
`model` holds its records, `render` draws the curves and the HTML, `write` stores the files when a grid ends.
Part of the read side (`results/`): imports db, settings, vocabulary, numbers, `grids.arms`, the detector's
policy and the other `results` modules, never api/, cli/ or dashboard/ (they import it)."""
