"""One frozen `EngineSpec` and one argument helper for `serve`, `run --engine`, `--simulate` and the builder."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from reference_engine.builder import build_engine
from reference_engine.config import EngineSpec
from reference_engine.errors import ConfigError
from reference_engine.serve_args import add_serve_arguments, engine_spec_from_args
from slobench.cli.common import add_engine_arguments, engine_knobs_from_args
from slobench.fleet.simulate import ModeledEngine

SHAPE = ["--profile", "h100-llama-1b", "--kv-blocks", "96", "--block-size", "32", "--max-num-seqs", "8",
         "--max-batched-tokens", "512", "--max-model-len", "1024", "--no-prefix-caching"]


def serve_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    return p.parse_args(list(argv))


def run_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)  # the verb's own (it also names a URL's model)
    add_engine_arguments(p)
    return p.parse_args(list(argv))


def test_serve_and_run_read_the_same_flags_into_the_same_spec() -> None:
    served = engine_spec_from_args(serve_args("--executor", "modeled", *SHAPE))
    in_process = engine_spec_from_args(run_args("--engine", "modeled", *SHAPE), in_process=True)
    assert served == in_process == EngineSpec(profile="h100-llama-1b", kv_blocks=96, block_size=32, max_num_seqs=8,
                                              max_batched_tokens=512, max_model_len=1024,
                                              enable_prefix_caching=False)
    # the defaults agree too, and are the spec's own
    assert engine_spec_from_args(serve_args()) == engine_spec_from_args(run_args(), in_process=True) == EngineSpec()


def test_the_spec_is_frozen_and_refuses_bad_values_by_name() -> None:
    spec = EngineSpec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.kv_blocks = 3  # type: ignore[misc]
    for knobs, field in [({"executor": "tpu"}, "executor"), ({"kv_blocks": 0}, "kv_blocks"),
                         ({"max_model_len": -1}, "max_model_len"), ({"block_size": True}, "block_size"),
                         ({"attention_backend": "flash"}, "attention_backend"),
                         ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"), ({"seed": 1.5}, "seed"),
                         ({"device": None}, "device")]:
        with pytest.raises(ConfigError, match=f"^{field}: "):
            EngineSpec(**knobs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown knobs"):
        EngineSpec.from_knobs({"kv_block": 64})
    assert EngineSpec.from_knobs(spec.to_knobs()) == spec


def test_a_bad_flag_value_is_refused_before_anything_is_built() -> None:
    with pytest.raises(ConfigError, match="kv_blocks: must be an integer >= 1"):
        engine_spec_from_args(serve_args("--kv-blocks", "0"))
    with pytest.raises(ConfigError, match="max_batched_tokens: must be an integer >= 1"):
        engine_knobs_from_args(run_args("--engine", "modeled", "--max-batched-tokens", "0"))


def test_the_manifest_knobs_keep_their_shape() -> None:
    assert engine_knobs_from_args(run_args("--engine", "modeled", *SHAPE)) == {
        "executor": "modeled", "model": "tiny", "profile": "h100-llama-1b", "kv_blocks": 96, "block_size": 32,
        "max_num_seqs": 8, "max_batched_tokens": 512, "max_model_len": 1024, "enable_prefix_caching": False,
    }
    assert list(engine_knobs_from_args(run_args())) == ["executor", "model", "profile", "kv_blocks", "block_size",
                                                        "max_num_seqs", "max_batched_tokens", "max_model_len",
                                                        "enable_prefix_caching"]
    torch = engine_knobs_from_args(run_args("--engine", "torch", "--engine-device", "cuda:1"))
    assert torch["executor"] == "torch" and torch["device"] == "cuda:1"
    assert "device" not in engine_knobs_from_args(run_args("--engine", "modeled", "--engine-device", "cuda"))


def test_the_simulator_and_the_builder_build_the_same_engine_from_one_spec() -> None:
    knobs = engine_knobs_from_args(run_args("--engine", "modeled", *SHAPE))
    built, _ = build_engine(EngineSpec.from_knobs(knobs))
    simulated = ModeledEngine.from_knobs(knobs)()
    assert simulated.config == built.config
    assert simulated.config.num_blocks == 96 and simulated.config.max_num_batched_tokens == 512
    assert ModeledEngine.from_knobs(knobs).name == "tiny"  # the model names the simulated engine
    assert ModeledEngine.from_knobs({"kv_blocks": None}) == ModeledEngine()  # sizes left open keep the defaults
    with pytest.raises(ConfigError, match="executor: a virtual-clock run needs the modeled executor"):
        ModeledEngine.from_knobs({"executor": "torch"})


def test_the_scheduler_policy_reaches_every_engine_and_the_manifest_only_when_not_the_default() -> None:
    served = engine_spec_from_args(serve_args("--scheduler", "vllm-v0"))
    knobs = engine_knobs_from_args(run_args("--engine", "modeled", "--scheduler", "vllm-v0"))
    assert served.scheduler == knobs["scheduler"] == "vllm-v0"
    built, _ = build_engine(EngineSpec.from_knobs(knobs))
    assert built.config.scheduler == ModeledEngine.from_knobs(knobs)().config.scheduler == "vllm-v0"
    assert "scheduler" not in engine_knobs_from_args(run_args("--engine", "modeled"))
    with pytest.raises(SystemExit):
        run_args("--scheduler", "fifo")


@pytest.mark.parametrize(("text", "size"), [("8388608", 8 << 20), ("8MiB", 8 << 20), ("512 KiB", 512 << 10),
                                            ("2mb", 2_000_000), ("1GiB", 1 << 30)])
def test_max_body_size_reads_bytes_and_units(text: str, size: int) -> None:
    assert serve_args("--max-body-size", text).max_body_size == size


@pytest.mark.parametrize("text", ["0", "-1", "8 MiBs", "1.5MiB", "lots", ""])
def test_a_bad_max_body_size_is_refused_by_argparse(text: str) -> None:
    with pytest.raises(SystemExit):
        serve_args("--max-body-size", text)


def test_max_body_size_defaults_to_8_mib() -> None:
    assert serve_args().max_body_size == 8 << 20
