"""One run: `runner` (open-loop dispatch against a target), `records` (one request's spec and record, and
requests.jsonl), `columnar` (requests.parquet: the records as columns), `rundir` (the run directory's other files: manifest, summary, server metrics, sweep,
capacity), `clock` (the run's one monotonic clock), `scrape` (the server's /metrics beside the run),
`clocksync` (Ray actors' clocks onto the run's), `precise_sleep`, `quiet_gc`, `outdir`."""
