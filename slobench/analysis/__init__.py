"""Records into numbers: `metrics` (the one column reader, TTFT/TPOT/ITL/E2E), `slo` (attainment and its
intervals), `summary` (the typed `RunSummary` every reader reads), `headline` (a sweep's highest rate
meeting the SLO), `warmup` (the MSER-5 cut)."""
