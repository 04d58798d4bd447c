"""Compile every Triton kernel launch the engine makes, ahead of time, for real GPUs, on a machine without one.

The host wrappers run on CPU tensors while each `@triton.jit` kernel of `reference_engine.kernels` is
swapped for a recorder; each recorded launch is then specialised as Triton would specialise it on a GPU
(pointer and int divisibility by 16, ints equal to 1 folded) and compiled to cubin for sm_90 and sm_80
with Triton's bundled ptxas. The interpreter (TRITON_INTERPRET=1) runs numpy and forgives what the
compiler refuses, so this catches what the CPU kernel tests cannot.

Run it in a process without TRITON_INTERPRET (under the interpreter `triton.jit` makes no compilable
kernels, and this refuses to run):

    python tests/aot_compile.py                  # every model x dtype x arch; exit 1 on any failure
    python tests/aot_compile.py --refusal-check  # a kernel the compiler must refuse is refused (exit 0)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

ARCHS = (90, 80)  # H100/H200, A100
MODELS = ("llama-3.2-1b", "tiny")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_TYPE_NAMES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "i1",
}
_DIVISIBLE = [["tt.divisibility", 16]]


@dataclass
class Launch:
    kernel: Any  # triton.runtime.jit.JITFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def bound(self) -> list[tuple[Any, Any]]:
        params = self.kernel.params
        values = list(self.args) + [self.kwargs[p.name] for p in params[len(self.args) :]]
        return list(zip(params, values, strict=True))

    def options(self) -> dict[str, Any]:
        names = {p.name for p in self.kernel.params}
        return {k: v for k, v in self.kwargs.items() if k not in names}

    def describe(self) -> str:
        consts = {p.name: v for p, v in self.bound() if p.is_constexpr}
        return f"{self.kernel.__name__}({consts})"

    def specialisation(self) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], Any]]:
        signature: dict[str, str] = {}
        constexprs: dict[str, Any] = {}
        attrs: dict[tuple[int, ...], Any] = {}
        for param, value in self.bound():
            name, idx = param.name, (param.num,)
            if param.is_constexpr or value is None:
                signature[name] = "constexpr"
                constexprs[name] = value
            elif isinstance(value, torch.Tensor):
                signature[name] = "*" + _TYPE_NAMES[value.dtype]
                if value.data_ptr() % 16 == 0:
                    attrs[idx] = _DIVISIBLE
            elif isinstance(value, bool):
                signature[name] = "i1"
            elif isinstance(value, int):
                if value == 1 and not param.do_not_specialize:
                    signature[name] = "constexpr"
                    constexprs[name] = 1
                    continue
                signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
                if value % 16 == 0 and not param.do_not_specialize:
                    attrs[idx] = _DIVISIBLE
            elif isinstance(value, float):
                signature[name] = "fp32"
            else:
                raise TypeError(f"{self.kernel.__name__}: argument {name}={value!r} of an unexpected type")
        return signature, constexprs, attrs

    def key(self) -> str:
        return repr(self.specialisation()) + repr(sorted(self.options().items()))


@dataclass
class Recorder:
    """Stands in for a `@triton.jit` function: `kernel[grid](...)` records the call instead of running it."""

    kernel: Any
    launches: list[Launch] = field(default_factory=list)

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.launches.append(Launch(self.kernel, args, kwargs))

        return launch


def compile_for(launch: Launch, arch: int) -> Any:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, constexprs, attrs = launch.specialisation()
    src = ASTSource(fn=launch.kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=launch.options())


def _require_compiler_mode() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("aot_compile: unset TRITON_INTERPRET (the interpreter makes no compilable kernels)")


@contextmanager
def recording() -> Iterator[list[Recorder]]:
    """Every `*_kernel` of the kernel modules swapped for a recorder, the dispatchers forced onto Triton."""
    _require_compiler_mode()
    from reference_engine.kernels import decode_attention, fused, kv_write, prefill_attention

    saved: list[tuple[Any, str, Any]] = []
    recorders: list[Recorder] = []
    old_force = os.environ.get("SLOBENCH_FORCE_TRITON")
    os.environ["SLOBENCH_FORCE_TRITON"] = "1"
    try:
        for module in (decode_attention, prefill_attention, kv_write, fused):
            for name, obj in list(vars(module).items()):
                if isinstance(obj, triton.runtime.jit.JITFunction) and name.endswith("_kernel"):
                    saved.append((module, name, obj))
                    rec = Recorder(obj)
                    setattr(module, name, rec)
                    recorders.append(rec)
        if not recorders:
            raise RuntimeError("no @triton.jit kernels found in reference_engine.kernels")
        yield recorders
    finally:
        for module, name, obj in saved:
            setattr(module, name, obj)
        if old_force is None:
            os.environ.pop("SLOBENCH_FORCE_TRITON", None)
        else:
            os.environ["SLOBENCH_FORCE_TRITON"] = old_force


def engine_launches(model: str, dtype: torch.dtype) -> None:
    """One decode step's and one prefill's worth of kernel calls at `model`'s shapes, through the public
    dispatchers, so the wrappers' own choices (padding, split count, precision) are what gets compiled."""
    from reference_engine import kernels
    from reference_engine.model import get_config

    cfg = get_config(model)
    h, kvh, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    block_size, num_blocks, seqs = 16, 64, 3
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.zeros(num_blocks, block_size, kvh, d, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    tables = torch.randperm(num_blocks, generator=gen)[: seqs * 8].reshape(seqs, 8).to(torch.int32)
    lens = torch.tensor([5, 100, 128], dtype=torch.int32)
    # q and k as the model hands them over: views into one fused qkv projection.
    qkv = torch.randn(seqs, (h + 2 * kvh) * d, generator=gen).to(dtype)
    q1 = qkv[:, : h * d].view(seqs, h, d)
    k1 = qkv[:, h * d : (h + kvh) * d].view(seqs, kvh, d)
    v1 = qkv[:, (h + kvh) * d :].view(seqs, kvh, d)
    kernels.write_kv(k1, v1, k_cache, v_cache, torch.tensor([3, 40, -1]))
    for splits in (1, 4):
        kernels.paged_decode_attention(q1, k_cache, v_cache, tables, lens, d**-0.5, num_splits=splits)
    cu = torch.tensor([0, 7, 30, 31], dtype=torch.int32)
    qn = torch.randn(31, h, d, generator=gen).to(dtype)
    prefix = torch.tensor([0, 16, 97], dtype=torch.int32)
    kernels.extend_attention(qn, k_cache, v_cache, cu, prefix, tables, d**-0.5, max_seqlen_q=23)
    x = torch.randn(seqs, cfg.dim, generator=gen).to(dtype)
    w = torch.ones(cfg.dim, dtype=dtype)
    kernels.rms_norm(x, w, 1e-5)
    kernels.add_rms_norm(x, x.clone(), w, 1e-5)
    cos = torch.randn(64, d // 2, generator=gen)
    kernels.apply_rotary_(q1, k1, torch.tensor([0, 5, 63]), cos, cos.clone())
    kernels.silu_and_mul(torch.randn(seqs, 2 * cfg.ffn_dim, generator=gen).to(dtype))


def check_all(models: tuple[str, ...] = MODELS, dtypes: tuple[str, ...] = tuple(DTYPES),
              archs: tuple[int, ...] = ARCHS) -> tuple[int, list[str]]:
    """(number of distinct launches compiled, failure messages)."""
    compiled, failures = 0, []
    for model in models:
        for dtype_name in dtypes:
            with recording() as recorders:
                engine_launches(model, DTYPES[dtype_name])
            never = sorted(r.kernel.__name__ for r in recorders if not r.launches)
            if never:
                failures.append(f"{model} {dtype_name}: kernels the dispatchers never launched: {never}")
            for rec in recorders:
                seen: set[str] = set()
                for launch in rec.launches:
                    if (key := launch.key()) in seen:
                        continue
                    seen.add(key)
                    for arch in archs:
                        where = f"{model} {dtype_name} sm_{arch} {launch.describe()}"
                        try:
                            out = compile_for(launch, arch)
                        except Exception as exc:  # noqa: BLE001 - every failure is collected and reported
                            failures.append(f"{where}: {type(exc).__name__}: {exc}"[:3000])
                            continue
                        if not out.asm.get("cubin") or f".target sm_{arch}" not in out.asm["ptx"]:
                            failures.append(f"{where}: no sm_{arch} cubin produced")
                        compiled += 1
    return compiled, failures


@triton.jit
def _runtime_len_kernel(x_ptr, n):  # the length of a tile must be a constexpr: the compiler refuses this
    r = tl.arange(0, n)
    tl.store(x_ptr + r, tl.load(x_ptr + r) * 2)


@triton.jit
def _constexpr_len_kernel(x_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(x_ptr + r, tl.load(x_ptr + r) * 2)


def refusal_check() -> list[str]:
    """Problems with the check itself: it must refuse the bad kernel and compile its fixed twin."""
    _require_compiler_mode()
    x = torch.zeros(64, dtype=torch.bfloat16)
    problems = []
    try:
        compile_for(Launch(_runtime_len_kernel, (x, 64), {"num_warps": 4}), 90)
        problems.append("a tile length given as a runtime int compiled; the compiler should refuse it")
    except Exception as exc:  # noqa: BLE001
        if "constexpr" not in str(exc):
            problems.append(f"refused for another reason than the constexpr length: {exc}"[:2000])
    good = compile_for(Launch(_constexpr_len_kernel, (x, 64), {"num_warps": 4}), 90)
    if not good.asm.get("cubin"):
        problems.append("the constexpr-length kernel produced no cubin")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--refusal-check", action="store_true", help="check that the check can fail, and stop")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--archs", default=",".join(map(str, ARCHS)))
    args = p.parse_args(argv)
    print(f"triton {triton.__version__}, torch {torch.__version__}")
    t0 = time.perf_counter()
    if args.refusal_check:
        problems = refusal_check()
        print("\n".join(problems) or "refusal check: the bad kernel was refused, its twin compiled")
        return 1 if problems else 0
    n, failures = check_all(tuple(args.models.split(",")), tuple(args.dtypes.split(",")),
                            tuple(int(a) for a in args.archs.split(",")))
    for f in failures:
        print("FAILED", f)
    print(f"compiled {n} kernel launches to cubin, {len(failures)} failures, {time.perf_counter() - t0:.1f} s")
    return 1 if failures or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
