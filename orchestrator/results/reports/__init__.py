"""The morning-after report of a grid: what each arm changed, its effect against its parent and the
control with intervals, the detector's stops, throughput and cost, samples; as JSON, Markdown and
self-contained HTML. Domain code: imports db, settings, vocabulary, numbers and storage, never api/,
cli/ or dashboard/ (they import it)."""
