"""Shared fixtures (servers in child processes on 127.0.0.1, each on a port it bound itself), and the tiers.

`token_server`: one scheduled-token server for the session (TTFT 50 ms, ITL 5 ms, model `test-model`, its
log on: pass `x_request_id` in extra_body to find a request's line); `token_server_url`: its base URL;
`start_token_server(**kwargs)`: a server with other settings, stopped after the test.
Tiers are markers, given here by module or test name. `slow`: starts a server or a process, or takes over
~1 s. `timing`: asserts on milliseconds of wall time, or on the slack before a send, so `make test` runs
these alone (a neighbouring xdist worker's CPU distorts them). `make test-fast` leaves both out and makes
torch, Triton and safetensors unimportable, showing the harness needs none of them. `nightly`: a
minute-long end-to-end test whose path CI covers another way; only `make test-all` runs it.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slobench.testing import TokenServerProcess

MODEL_STACK = ("torch", "triton", "safetensors")


class _NotInstalled(importlib.abc.MetaPathFinder):
    """What a machine without the engine extra sees: importing torch fails."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] in MODEL_STACK:
            raise ModuleNotFoundError(f"No module named {name!r} (SLOBENCH_WITHOUT_TORCH=1)", name=name)
        return None


if os.environ.get("SLOBENCH_WITHOUT_TORCH") == "1":
    sys.meta_path.insert(0, _NotInstalled())

SERVER_FIXTURES = frozenset({"token_server", "token_server_url", "start_token_server", "quirky"})
# modules whose tests start servers, processes or Ray inline, or drive the CLI against them
SERVER_MODULES = frozenset({
    "test_action", "test_action_llamacpp", "test_action_update_baseline", "test_bad_input_cli", "test_calibrate",
    "test_engine_body_limits", "test_engine_connections", "test_engine_faults", "test_engine_server",
    "test_engine_target",
    "test_engine_timeline", "test_engine_openapi", "test_engine_hostile_input", "test_gate_engine", "test_input_files",
    "test_gpu_portability", "test_history_browser", "test_install_extras", "test_nodelay", "test_one_rule",
    "test_openai_target", "test_ray_pool", "test_report_browser", "test_run_durability", "test_run_streamed",
    "test_server_quirks", "test_text_prompts", "test_trace_replay", "test_workers", "test_redact", "test_golden", "test_docs",
    "test_packaging",  # builds a wheel in a child process
    "test_transport_differential", "test_transport_resend",
    "test_signal_at_the_end",
    "test_extra_body", "test_api_cli_parity",
    "test_prompt_lengths",
    "test_sessions_wait",
    "test_reasoning_server", "test_reasoning_timing", "test_responses_api",
    "test_tune_live",  # starts servers and capacity searches as child processes
    "test_tune_guided",  # starts a server and simulated capacity searches as child processes
    "test_early_stop_live",  # sweeps against the bundled engine's server
})
# modules that assert on milliseconds of wall time: the `timing` marker, run alone after the parallel tier
TIMING_MODULES = frozenset({
    "test_openai_target", "test_workers", "test_fleet_target", "test_clocksync", "test_precise_sleep",
    "test_nodelay", "test_runner", "test_text_prompts", "test_ray_pool", "test_rawhttp", "test_quiet_gc",
    "test_engine_body_limits", "test_reasoning_timing",
})
# single tests elsewhere whose assertions rest on how much slack the runner had before a send, which a
# neighbouring worker's CPU takes away (both failed in the parallel tier on a loaded machine)
TIMING = frozenset({
    "test_run_streamed.py::test_the_runner_builds_ahead_in_the_slack_never_between_a_spawn_and_its_send",
    "test_run_streamed.py::test_the_runner_takes_a_stream_as_it_sends",
})
# tests of those modules that assert on no wall time and pass with both cores kept busy by other
# processes: the parallel tier runs them (a test's own wall time, sleeping on a timer included, costs
# that tier little: its workers outnumber the cores)
UNTIMED = frozenset({
    "test_quiet_gc.py::test_a_run_the_valve_collected_says_so_in_the_terminal_and_the_report",
    "test_quiet_gc.py::test_the_send_path_makes_no_cyclic_garbage_per_request",
    "test_rawhttp.py::test_drain_reads_the_rest_of_the_body_and_leaves_the_connection_reusable",
    "test_text_prompts.py::test_exact_text_through_a_text_only_server",
    "test_workers.py::test_cli_client_workers",
})
# single tests that start a process or take over ~1 s of CPU (pytest --durations)
SLOW = frozenset({
    "test_calibrate_from_runs.py::test_the_fit_recovers_known_host_costs_within_its_uncertainty",
    "test_calibrate_from_runs.py::test_validate_published_calibrates_a_custom_setup_then_replays",
    "test_capacity_seeds.py::test_the_readme_tour_example_concludes",
    "test_disagg.py::test_free_link_pd_does_not_lose_tpot_to_a_colocated_pair_on_decode_heavy_work",
    "test_fit.py::test_a_lognormal_trace_gets_a_lognormal_spec",
    "test_fit.py::test_fit_cli_writes_a_spec_whose_lengths_match_the_trace",
    "test_fit.py::test_fitted_azure_specs_regenerate_the_trace_quantiles",
    "test_fit.py::test_forced_choices_are_respected",
    "test_fit_bursts.py::test_fitted_spec_has_per_class_lengths",
    "test_fit_bursts.py::test_fitted_spec_keeps_dispersion_at_1s_and_1min",
    "test_fit_bursts.py::test_the_azure_code_trace_keeps_its_bursts",
    "test_fleet_target.py::test_cli_several_urls",
    "test_fleet_target.py::test_in_process_fleet_matches_the_simulated_fleet",
    "test_fleet_target.py::test_per_replica_summary_shows_an_affinity_hot_spot",
    "test_metrics_slo.py::test_tail_quantile_interval_covers_where_the_bootstrap_alone_does_not",
    "test_parsers_fuzz.py::test_record_reader",
    "test_parsers_fuzz.py::test_slo_tables",
    "test_parsers_fuzz.py::test_trace_files",
    "test_parsers_fuzz.py::test_workload_specs",
    "test_phases.py::test_bundled_day_shift_is_prefill_heavy_then_decode_heavy",
    "test_phases.py::test_duration_and_count_cut_a_phased_run",
    "test_plan.py::test_search_finds_the_brute_force_cheapest_fleet",
    "test_plan.py::test_serial_and_process_pools_give_the_same_plan",
    "test_plan.py::test_the_plan_meets_the_slo_where_it_says_so_and_its_json",
    "test_public_api.py::test_run_load_against_a_server",
    "test_public_api.py::test_simulate_load_summarize_compare_report",
    "test_records_format.py::test_to_json_writes_the_same_bytes_as_before",
    "test_replay_rate.py::test_azure_duration_offers_the_asked_rate",
    "test_report.py::test_big_run_is_decimated_and_small",
    "test_report.py::test_quantiles_resting_on_few_tail_values_are_marked",
    "test_report.py::test_rate_table_shows_request_classes",
    "test_report.py::test_rows_past_capacity_are_marked",
    "test_report.py::test_sections_in_order_and_self_contained",
    "test_scheduler.py::test_random_add_step_abort_keeps_accounting_and_outputs_exact",
    "test_sessions.py::test_random_turn_counts_and_think_times",
    "test_simulate.py::test_attainment_falls_as_rate_rises_across_the_cliff",
    "test_simulate.py::test_deterministic_for_a_seed_and_jitter_changes_with_it",
    "test_simulate.py::test_least_outstanding_spreads_a_burst_and_beats_round_robin_on_heavy_tails",
    "test_simulate.py::test_prefix_affinity_keeps_shared_prefixes_on_one_replica",
    "test_simulate.py::test_queue_drift_flags_runs_past_capacity",
    "test_simulate.py::test_sweep_crosses_the_target_where_capacity_finds_capacity",
    "test_simulate_decode_runs.py::test_decode_runs_leave_every_record_as_stepping_does",
    "test_simulate_decode_runs.py::test_engines_end_in_the_same_state",
    "test_simulate_pinned.py::test_records_match_the_pinned_digest",
    "test_sse.py::test_any_split_yields_the_same_events",
    "test_sse.py::test_the_fast_path_yields_what_feed_yields",
    "test_step_log.py::test_the_demo_keeps_the_step_log_and_says_how_fast_each_point_ran",  # runs the engine
    "test_stop.py::test_streamed_cut_equals_the_reference",
    "test_trace_stream.py::test_memory_does_not_grow_with_the_trace",
    "test_trace_stream.py::test_streamed_replay_matches_replay_in_times_counts_and_shared_blocks",
    "test_trace_stream.py::test_taking_the_first_request_reads_only_a_prefix",
    "test_traces.py::test_the_azure_samples_load_whole",
    "test_sweep_auto.py::test_auto_rates_straddle_the_cliff_at_any_step_cost",
    "test_warmup.py::test_runner_auto_warmup_marks_rewrites_and_summarises",
    "test_workload_spec.py::test_bundled_specs_generate_their_target_quantiles",
})

# minute-long end-to-end tests that CI runs another way, by what covers them: `make test-all` only
NIGHTLY = frozenset({
    # .ci/gate.sh gates the same engine over HTTP through the same CLI (capacity --rates, gate), every CI run
    "test_gate_engine.py::test_gate_through_http_server",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        short = f"{path.name}::{item.name.split('[')[0]}"
        if (SERVER_FIXTURES & set(getattr(item, "fixturenames", ())) or path.stem in SERVER_MODULES
                or short in SLOW or path.parent.name == "conformance"):
            item.add_marker(pytest.mark.slow)
        if (path.stem in TIMING_MODULES and short not in UNTIMED) or short in TIMING:
            item.add_marker(pytest.mark.timing)
        if short in NIGHTLY:
            item.add_marker(pytest.mark.nightly)


@pytest.fixture(scope="session")
def token_server() -> Iterator[TokenServerProcess]:
    with TokenServerProcess(ttft_ms=50.0, itl_ms=5.0, log=True) as srv:
        yield srv


@pytest.fixture(scope="session")
def token_server_url(token_server: TokenServerProcess) -> str:
    return token_server.base_url


@pytest.fixture
def start_token_server() -> Iterator[Callable[..., TokenServerProcess]]:
    started: list[TokenServerProcess] = []

    def start(**kwargs: object) -> TokenServerProcess:
        srv = TokenServerProcess(**kwargs).start()  # type: ignore[arg-type]
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture
def simulated_engines(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every LLMEngine slobench.fleet.simulate builds from now on, in order (each run builds one from its
    factory, then the one it steps, in slobench.fleet.replica): to compare the state engines end in."""
    import slobench.fleet.replica
    import slobench.fleet.simulate
    from reference_engine.engine import LLMEngine

    built: list[Any] = []

    class Recorded(LLMEngine):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            built.append(self)

    monkeypatch.setattr(slobench.fleet.simulate, "LLMEngine", Recorded)
    monkeypatch.setattr(slobench.fleet.replica, "LLMEngine", Recorded)
    return built


@pytest.fixture
def quirky() -> Iterator[Callable[..., TokenServerProcess]]:
    """A factory of token servers with real servers' quirks (fast: TTFT 2 ms, ITL 1 ms), stopped after the test."""
    started: list[TokenServerProcess] = []

    def start(*quirks: str, **kw: Any) -> TokenServerProcess:
        srv = TokenServerProcess(ttft_ms=2, itl_ms=1, quirks=quirks, **kw).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
