"""Fleets: routing policies, the simulated fleet (the engine's real scheduler on a virtual clock),
disaggregated prefill/decode pools and the client-routed target."""
