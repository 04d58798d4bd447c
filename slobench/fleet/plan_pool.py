"""Where the planner's evaluations run: in this process, in local processes (`--jobs N`), or as Ray tasks
(`--ray ADDRESS`). Every job is a pure function of (day recipe, setup, job), so the three give the same
results for a seed; a worker rebuilds the day's windows from the recipe once and keeps them.

Jobs: ("search", window, target, max_instances, kinds) -> WindowSearch; ("eval", window, fleet, previous,
switch_share) -> Evaluation; ("profile", kind, input_tokens, output_tokens, rate_rps, num_requests) ->
Evaluation (the interpolation baseline's profiling runs).
"""

from __future__ import annotations

import os
import pickle
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from slobench.errors import UsageError
from slobench.fleet import plan
from slobench.fleet.plan_day import DayRecipe, Window, build_windows

__all__ = ["PlanPool", "run_job"]

_WINDOWS: dict[int, list[Window]] = {}
_CONTEXT: tuple[DayRecipe, Any] | None = None


def windows_for(recipe: DayRecipe) -> list[Window]:
    key = zlib.crc32(pickle.dumps(recipe))
    if key not in _WINDOWS:
        _WINDOWS.clear()  # one day at a time per process
        _WINDOWS[key] = build_windows(recipe)
    return _WINDOWS[key]


def run_job(recipe: DayRecipe, setup: Any, job: tuple[Any, ...]) -> Any:
    kind = job[0]
    if kind == "search":
        _, w, target, max_instances, kinds = job
        window = windows_for(recipe)[w]
        return plan.search_window(window, lambda f: plan.evaluate(setup, window, f), target,
                                  max_instances=max_instances, kinds=kinds)
    if kind == "eval":
        _, w, fleet, previous, share = job
        return plan.evaluate(setup, windows_for(recipe)[w], fleet, previous, share)
    if kind == "profile":
        return plan.profile_run(setup, *job[1:])
    raise ValueError(f"unknown planner job {kind!r}")


def _init_worker(recipe: DayRecipe, setup: Any) -> None:
    global _CONTEXT
    _CONTEXT = (recipe, setup)


def _run_in_worker(job: tuple[Any, ...]) -> Any:
    assert _CONTEXT is not None
    return run_job(*_CONTEXT, job)


class PlanPool:
    """`map(jobs)` -> results in job order. `jobs` 1: this process; N: N local processes; `ray`: Ray tasks
    on the cluster at that address ("local": a local instance). `on_progress(done, total)` hears each
    map's start (0, total) and each job finished, in order."""

    def __init__(self, recipe: DayRecipe, setup: Any, *, jobs: int = 1, ray: str | None = None,
                 on_progress: Callable[[int, int], None] | None = None) -> None:
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise UsageError(f"--jobs: must be an integer >= 1 (got {jobs!r})")
        self.recipe, self.setup, self.jobs, self.ray_address = recipe, setup, jobs, ray
        self._executor: ProcessPoolExecutor | None = None
        self._ray: Any = None
        self._remote: Any = None
        self._owns_ray = False
        self.num_jobs_run = 0
        self.on_progress = on_progress or (lambda done, total: None)

    def __enter__(self) -> PlanPool:
        if self.ray_address is not None:
            try:
                import ray
            except ImportError:
                raise UsageError("--ray needs Ray, which is not installed: pip install 'slobench[ray]'") from None
            if not ray.is_initialized():
                init: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
                if self.ray_address in ("", "local"):
                    init |= {"address": "local", "num_cpus": max(self.jobs, os.cpu_count() or 1)}
                else:
                    init["address"] = self.ray_address
                ray.init(**init)
                self._owns_ray = True
            self._ray = ray
            self._remote = ray.remote(num_cpus=1)(run_job)
            self._refs = (ray.put(self.recipe), ray.put(self.setup))
        elif self.jobs > 1:
            import multiprocessing

            # spawn: a fresh interpreter per worker, so no lock or thread state of this one is copied
            self._executor = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_init_worker, initargs=(self.recipe, self.setup))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._executor is not None:
            self._executor.shutdown(cancel_futures=True)
            self._executor = None
        if self._ray is not None and self._owns_ray:
            self._ray.shutdown()
        self._ray = None

    @property
    def kind(self) -> str:
        if self.ray_address is not None:
            return f"ray({self.ray_address or 'local'})"
        return f"processes({self.jobs})" if self.jobs > 1 else "serial"

    def map(self, jobs: Sequence[tuple[Any, ...]]) -> list[Any]:
        self.num_jobs_run += len(jobs)
        if not jobs:
            return []
        self.on_progress(0, len(jobs))
        if self._ray is not None:
            recipe_ref, setup_ref = self._refs
            results = iter(self._ray.get([self._remote.remote(recipe_ref, setup_ref, j) for j in jobs]))
        elif self._executor is not None and len(jobs) > 1:
            results = self._executor.map(_run_in_worker, jobs)
        else:
            results = (run_job(self.recipe, self.setup, j) for j in jobs)
        out = []
        for result in results:
            out.append(result)
            self.on_progress(len(out), len(jobs))
        return out
