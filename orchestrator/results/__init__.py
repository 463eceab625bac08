"""Results: the read side, what every reader builds from the stored rows and files.

Here: runs, metrics, grids and sweeps as the views every reader shows (`views`), a run's sample images
(`samples`), a command arm's own metrics (`own_metrics`), how well a run's data kept its GPU fed
(`data_feed`), published curves and their import as a grid (`curves`, `importer`), each grid's report (`reports/`), and
deciding a grid in looks (`deciding/`: the sequential maths, borrowed variances, the bounded spend, the
decision pass and its looks as the report reads them).

May import: `orchestrator.db`, the shared top-level modules, `grids` and the pure parts of `runs` (the
detector's policy, the ingest's series). Never `trackers`, `sweeps` or a surface (api, cli, dashboard
import it).
"""
