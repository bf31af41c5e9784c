"""One run, from settings to results: the composed config turned once into typed settings
(`settings`), every cached data kind's one owner (`artifacts`), the session that builds or loads
them (`session`), the data checks before any model loads (`preflight`), one question's path
through retrieval and reranking (`query`) and its latency sample (`latency`), the stages read top
to bottom (`pipeline`), the dry run (`plan`, `role_plan`), what the questions and the fitted parts
came from (`provenance`, `fitted`), and the results: `result` (metrics.json, typed), `output` (the
run's files, whole or not at all), `rundir` (a directory holds one run's or one sweep's results
only)."""
