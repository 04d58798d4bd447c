"""Any GPU from its datasheet: the built-in list (slobench/data/gpus.toml), a GPU by its numbers, a spec file,
and the refusals, each naming the key."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from reference_engine.executor.modeled_executor import CostProfile
from slobench.cli import main
from slobench.errors import SpecError
from slobench.profiles import GPUS, get_gpu, kv_capacity_tokens, roofline
from slobench.profiles.roofline import roofline_from_name
from slobench.profiles.specs import GPU_KEYS, GPUS_FILE

COMMON_INFERENCE_GPUS = ("h100", "h200", "a100", "l40s", "l4", "a10g", "rtx6000-ada", "h20", "h100-pcie", "b200",
                         "mi300x")
H100_NUMBERS = "bf16_tflops=989,mem_gbs=3350,mem_gib=79.6474609375,link_gbs=450"


def coefficients(p: CostProfile) -> CostProfile:
    """The profile without what names it (its name, its note): the step-time model alone."""
    return replace(p, name="", note="")


def test_the_built_in_list_holds_the_common_inference_gpus_each_with_its_source() -> None:
    assert set(COMMON_INFERENCE_GPUS) <= set(GPUS)
    for g in GPUS.values():
        assert any(v in g.source for v in ("NVIDIA", "AMD")), g
    assert "mi300x" in GPUS_FILE.read_text()


@pytest.mark.parametrize("name", COMMON_INFERENCE_GPUS)
def test_every_built_in_gpu_builds_a_roofline_for_a_model_that_fits(name: str) -> None:
    p = roofline("llama-3.1-8b", name)
    assert p.provenance is not None and p.provenance["gpu"]["name"] == name
    assert p.weights_read_s > 0 and p.compute_per_token_s > 0
    assert kv_capacity_tokens("llama-3.1-8b", name) > 0
    # a faster memory reads the weights sooner: the step model follows the datasheet
    assert p.weights_read_s == pytest.approx(roofline("llama-3.1-8b", "h100").weights_read_s
                                             * GPUS["h100"].hbm_tb_s / GPUS[name].hbm_tb_s)


def test_the_built_in_figures_are_the_ones_the_profiles_were_built_with() -> None:
    """Moving the list into the data file kept the four GPUs that were there before, number for number."""
    h100, a100, l40s = GPUS["h100"], GPUS["a100"], GPUS["l40s"]
    assert (h100.bf16_tflops, h100.hbm_tb_s, h100.link_gb_s, h100.memory_mib) == (989.0, 3.35, 450.0, 81_559)
    assert (a100.bf16_tflops, a100.hbm_tb_s, a100.link_gb_s, a100.memory_mib) == (312.0, 2.039, 300.0, 81_920)
    assert (l40s.bf16_tflops, l40s.hbm_tb_s, l40s.link_gb_s, l40s.memory_mib) == (362.05, 0.864, 32.0, 46_068)
    assert GPUS["h200"].memory_mib == 143_771


def test_a_gpu_by_its_numbers_gives_the_built_in_ones_profile(tmp_path: Path) -> None:
    built_in = roofline("llama-3.1-70b", "h100", 4)
    by_numbers = roofline("llama-3.1-70b", H100_NUMBERS, 4)
    assert by_numbers.name == "roofline-custom-llama-3.1-70b-tp4"
    assert coefficients(by_numbers) == coefficients(built_in)
    spec = {"name": "my-h100", "source": "the H100 SXM datasheet, by hand",
            **{k: float(v) for k, v in (kv.split("=") for kv in H100_NUMBERS.split(","))}}
    toml = tmp_path / "gpu.toml"
    toml.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in spec.items()))
    js = tmp_path / "gpu.json"
    js.write_text(json.dumps(spec))
    for path in (toml, js):
        from_file = roofline("llama-3.1-70b", str(path), 4)
        assert from_file.name == "roofline-my-h100-llama-3.1-70b-tp4"
        assert coefficients(from_file) == coefficients(built_in)
        assert from_file.provenance is not None and from_file.provenance["gpu"]["source"] == spec["source"]
    # and through --profile roofline:GPU/MODEL[/tpN], numbers and file path alike
    assert coefficients(roofline_from_name(f"roofline:{H100_NUMBERS}/llama-3.1-70b/tp4")) == coefficients(built_in)
    assert coefficients(roofline_from_name(f"roofline:{toml}/llama-3.1-70b/tp4")) == coefficients(built_in)
    assert coefficients(CostProfile.load(f"roofline:{js}/llama-3.1-70b/tp4")) == coefficients(built_in)


def test_the_profile_verb_writes_the_same_profile_from_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["profile", "--gpu", "l40s", "--model", "llama-3.1-8b", "-o", str(a)]) == 0
    numbers = "bf16_tflops=362.05,mem_gbs=864,mem_gib=44.98828125,link_gbs=32"
    assert main(["profile", "--gpu", numbers, "--model", "llama-3.1-8b", "-o", str(b)]) == 0
    pa, pb = (json.loads(p.read_text()) for p in (a, b))
    for doc in (pa, pb):
        for k in ("name", "note", "provenance"):
            doc.pop(k)
    assert pa == pb


@pytest.mark.parametrize(("spec", "key"), [
    ("bf16_tflops=362,mem_gbs=864,mem_gib=44.5", "link_gbs"),  # missing
    ("bf16_tflops=362,mem_gbs=864,mem_gib=44.5,link_gbs=32,sparse_tflops=724", "sparse_tflops"),  # unknown
    ("bf16_tflops=362,mem_gbs=864,mem_gib=0,link_gbs=32", "mem_gib"),  # not positive
    ("bf16_tflops=-362,mem_gbs=864,mem_gib=44.5,link_gbs=32", "bf16_tflops"),
    ("bf16_tflops=362,mem_gbs=0.864,mem_gib=44.5,link_gbs=32", "mem_gbs"),  # TB/s written for GB/s: absurd
    ("bf16_tflops=362,mem_gbs=864,mem_gib=46068,link_gbs=32", "mem_gib"),  # MiB written for GiB: absurd
    ("bf16_tflops=3620000,mem_gbs=864,mem_gib=44.5,link_gbs=32", "bf16_tflops"),
    ("bf16_tflops=362,mem_gbs=fast,mem_gib=44.5,link_gbs=32", "mem_gbs"),  # not a number
    ("bf16_tflops=362,mem_gbs=nan,mem_gib=44.5,link_gbs=32", "mem_gbs"),
    ("bf16_tflops=362,mem_gbs=864,mem_gib=44.5,link_gbs=32,link_gbs=64", "link_gbs"),  # twice
])
def test_a_bad_spec_is_refused_naming_the_key(spec: str, key: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SpecError) as e:
        get_gpu(spec)
    assert e.value.field == f"gpu {key}"
    assert main(["profile", "--gpu", spec, "--model", "llama-3.1-8b"]) == 2
    assert f"gpu {key}:" in capsys.readouterr().err
    with pytest.raises(SpecError, match=f"gpu {key}"):
        roofline_from_name(f"roofline:{spec}/llama-3.1-8b")


def test_a_bad_spec_file_is_refused_naming_the_key(tmp_path: Path) -> None:
    numbers = {k: 100.0 for k in GPU_KEYS}
    cases = {
        "no-source.toml": ('name = "x"\n' + "".join(f"{k} = 100.0\n" for k in GPU_KEYS), "gpu source"),
        "extra.json": (json.dumps({"name": "x", "source": "y", "fp8_tflops": 1, **numbers}), "gpu fp8_tflops"),
        "zero.json": (json.dumps({"name": "x", "source": "y", **numbers, "link_gbs": 0}), "gpu link_gbs"),
        "bool.json": (json.dumps({"name": "x", "source": "y", **numbers, "mem_gib": True}), "gpu mem_gib"),
        "list.json": ("[1, 2]", "gpu"),
        "broken.toml": ("name = ", "gpu"),
        "absent.toml": (None, "gpu"),
    }
    for name, (text, field) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(SpecError) as e:
            get_gpu(str(path))
        assert e.value.field == field, name


def test_an_unknown_name_lists_the_known_ones_and_the_other_forms() -> None:
    with pytest.raises(SpecError, match="mi300x.*by its numbers.*spec file"):
        get_gpu("h300")
