"""One run: `runner` (open-loop dispatch against a target), `records` (specs, records and every run-directory
file's reader and writer), `clock` (the run's one monotonic clock), `scrape` (the server's /metrics beside
the run), `clocksync` (Ray actors' clocks onto the run's), `precise_sleep`, `outdir`."""
