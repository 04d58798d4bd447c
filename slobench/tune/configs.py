"""Configurations to tune: a command template and the parameter values that fill it.

A grid (`--param name=v1,v2` or a TOML `[grid]`) is crossed; the lists of one TOML `[[link]]` table are
zipped (tensor parallelism and its GPU count move together); `[[config]]` tables are explicit
configurations added after. Every placeholder must be a parameter (or `{port}`), and every parameter must
be used by the template, checked before anything starts.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import shlex
import string
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slobench.errors import UsageError

Value = int | float | str

# The bundled engine's knobs a tune may vary without a command template: each is a flag of both
# `slobench serve` and `slobench capacity --simulate`, spelled with dashes.
ENGINE_KNOBS = ("max_num_seqs", "kv_blocks", "max_batched_tokens", "block_size", "max_model_len", "profile",
                "scheduler")
SIMULATE_ONLY_KNOBS = ("replicas",)  # a simulated fleet of N engines behind the router: N GPUs
GPUS = "gpus"  # a parameter of this name is the configuration's GPU count, used by the template or not


@dataclass(frozen=True, slots=True)
class TuneConfig:
    """One configuration: its parameters, the GPUs it takes, and the server's argv with `{port}` left in."""

    name: str
    params: dict[str, Value] = field(hash=False)
    gpus: int
    argv: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise UsageError(f"{self.name}: gpus must be 1 or more (got {self.gpus})")

    def command(self, port: int | None = None) -> list[str]:
        """The server's argv, `{port}` filled in where a port is given."""
        return [a.replace("{port}", str(port)) if port is not None else a for a in self.argv]


def config_name(params: dict[str, Value]) -> str:
    """A configuration's directory name, from its parameters (stable when the grid around it changes)."""
    text = "_".join(f"{k}-{v}" for k, v in params.items()) or "default"
    name = re.sub(r"[^A-Za-z0-9_.+-]", "-", text)
    if len(name) > 80:
        name = name[:64] + "-" + hashlib.sha256(text.encode()).hexdigest()[:12]
    return name


def parse_value(text: str) -> Value:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_params(specs: list[str]) -> dict[str, list[Value]]:
    """`--param name=v1,v2,...` flags as a grid."""
    grid: dict[str, list[Value]] = {}
    for spec in specs:
        name, eq, values = spec.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier() or not values.strip():
            raise UsageError(f"--param {spec!r}: expected NAME=V1,V2,... (NAME a placeholder of --serve-cmd)")
        if name in grid:
            raise UsageError(f"--param {name} given twice")
        grid[name] = [parse_value(v.strip()) for v in values.split(",")]
    return grid


def cross(grid: dict[str, list[Value]]) -> list[dict[str, Value]]:
    names = list(grid)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(grid[n] for n in names))]


def link(table: dict[str, Any], where: str) -> list[dict[str, Value]]:
    lengths = {len(v) if isinstance(v, list) else -1 for v in table.values()}
    if len(lengths) != 1 or -1 in lengths or 0 in lengths:
        raise UsageError(f"{where}: every parameter of a [[link]] table is a list, all of one length "
                         f"(got {table!r:.120})")
    names = list(table)
    return [dict(zip(names, row, strict=True)) for row in zip(*(table[n] for n in names), strict=True)]


@dataclass(frozen=True, slots=True)
class ConfigFile:
    serve_cmd: str | None
    gpus: str | int | None
    param_sets: list[dict[str, Value]]


def read_config_file(path: Path) -> ConfigFile:
    """A tune's TOML: `serve_cmd`, `gpus` (a number or a template such as "{tp}"), `[grid]`, `[[link]]`
    tables zipped within and crossed with the grid, and `[[config]]` tables listed as they are."""
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"--config {path}: {e}") from None
    unknown = set(doc) - {"serve_cmd", "gpus", "grid", "link", "config"}
    if unknown:
        raise UsageError(f"--config {path}: unknown keys {sorted(unknown)} (serve_cmd, gpus, grid, link, config)")
    grid = doc.get("grid", {})
    if not isinstance(grid, dict) or any(not isinstance(v, list) or not v for v in grid.values()):
        raise UsageError(f"--config {path}: [grid] maps each parameter to a non-empty list")
    product = cross(grid)
    for i, table in enumerate(doc.get("link", [])):
        rows = link(table, f"--config {path}: [[link]] {i + 1}")
        clash = set(table) & set(product[0])
        if clash:
            raise UsageError(f"--config {path}: {sorted(clash)} both in [grid] and a [[link]] table")
        product = [{**a, **b} for a in product for b in rows]
    explicit = doc.get("config", [])
    sets = (product if (grid or doc.get("link")) else []) + [dict(c) for c in explicit]
    if not sets:
        raise UsageError(f"--config {path}: no configurations ([grid], [[link]] or [[config]])")
    gpus = doc.get("gpus")
    if gpus is not None and not isinstance(gpus, int | str):
        raise UsageError(f"--config {path}: gpus is a number or a template such as \"{{tp}}\"")
    return ConfigFile(doc.get("serve_cmd"), gpus, sets)


def placeholders(template: str) -> set[str]:
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:
        raise UsageError(f"--serve-cmd {template!r}: {e}") from None


def gpus_of(params: dict[str, Value], gpus: str | int | None, name: str) -> int:
    raw: Any = params.get(GPUS, gpus if gpus is not None else 1)
    if isinstance(raw, str):
        try:
            raw = raw.format(**params)
        except (KeyError, IndexError, ValueError) as e:
            raise UsageError(f"{name}: gpus {raw!r} names no parameter of this configuration ({e})") from None
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise UsageError(f"{name}: gpus must be a whole number (got {raw!r})") from None


def from_template(template: str, param_sets: list[dict[str, Value]], gpus: str | int | None) -> list[TuneConfig]:
    """Configurations from `--serve-cmd`: exit 2 for a placeholder that names no parameter, a parameter the
    template never uses, or a template without `{port}`."""
    used = placeholders(template)
    if "port" not in used:
        raise UsageError("--serve-cmd has no {port}: each server must listen on the port tune gives it")
    configs: list[TuneConfig] = []
    for params in param_sets:
        name = config_name(params)
        unknown = used - set(params) - {"port"}
        if unknown:
            raise UsageError(f"--serve-cmd: placeholder(s) {sorted(unknown)} name no parameter of {name} "
                             f"(its parameters: {sorted(params)})")
        unused = set(params) - used - {GPUS}
        if unused:
            raise UsageError(f"parameter(s) {sorted(unused)} never used by --serve-cmd (placeholders: {sorted(used)})")
        text = template.format(**{**{k: str(v) for k, v in params.items()}, "port": "{port}"})
        try:
            argv = tuple(shlex.split(text))
        except ValueError as e:
            raise UsageError(f"--serve-cmd: {e}") from None
        add(configs, TuneConfig(name, params, gpus_of(params, gpus, name), argv))
    return configs


def add(configs: list[TuneConfig], config: TuneConfig) -> None:
    if any(c.params == config.params for c in configs):
        raise UsageError(f"configuration {config.params} listed twice")
    if any(c.name == config.name for c in configs):
        raise UsageError(f"configurations {config.params} and another share the directory name {config.name}")
    configs.append(config)


def knob_flags(params: dict[str, Value], allowed: tuple[str, ...]) -> list[str]:
    flags = []
    for knob, value in params.items():
        if knob == GPUS:
            continue
        if knob not in allowed:
            raise UsageError(f"--param {knob}: not a knob of the bundled engine (knobs: {', '.join(allowed)}); "
                             f"give --serve-cmd to tune another server")
        flags += [f"--{knob.replace('_', '-')}", str(value)]
    return flags


def bundled_engine(param_sets: list[dict[str, Value]], gpus: str | int | None, *, simulate: bool,
                   serve_args: list[str]) -> list[TuneConfig]:
    """Configurations of the bundled engine: a `slobench serve --executor modeled` server each, or for
    `--simulate` the knobs alone (argv: the capacity flags), the GPUs a simulated fleet's replicas."""
    allowed = ENGINE_KNOBS + (SIMULATE_ONLY_KNOBS if simulate else ())
    configs: list[TuneConfig] = []
    for params in param_sets:
        name = config_name(params)
        flags = knob_flags(params, allowed)
        if simulate:
            argv = tuple(flags)
            n = gpus_of(params, gpus if gpus is not None else int(params.get("replicas", 1)), name)
        else:
            argv = (sys.executable, "-m", "slobench", "serve", "--executor", "modeled", "--port", "{port}",
                    *serve_args, *flags)
            n = gpus_of(params, gpus, name)
        add(configs, TuneConfig(name, params, n, argv))
    return configs
