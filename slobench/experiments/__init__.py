"""Choosing rates and measuring them: `probe` (one rate, one seed, one run directory: live or virtual),
`sweep` (a list of rates and the headline), `capacity` (the search for the highest rate that meets the SLO)."""
