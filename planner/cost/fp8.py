"""FP8 casts and GEMMs as the engines run them, by scaling recipe.

Two cast implementations, named by the engine profile's ``fp8.casts``:

* ``te`` -- Transformer Engine (Megatron-core, any ``--fp8-recipe``): one fused quantize kernel per
  GEMM input that reads the 16-bit tensor and writes the FP8 tensor and its transpose (or, for
  MXFP8 and the 1x128 blockwise recipe, its row- and column-scaled copies) in one pass; the FP8
  weights are cached for the step (``is_first_microbatch``), so weights are cast once a step
  (:func:`planner.cost.stages.stage_sync`). Constants.FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT (4 B)
  for the input in forward and the output gradient in backward.
* ``torchao`` -- torchao ``Float8Linear`` (torchtitan's ``quantize.linear.float8``).
  ``matmul_with_hp_or_float8_args`` (torchao/float8/float8_linear.py) saves the 16-bit input and
  weight and casts each GEMM operand dynamically: the input and the weight in forward; the output
  gradient twice (for the input gradient along its rows, for the weight gradient along its
  columns), the weight again and the input again in backward. A dynamic cast is a reduction
  (``tensor_to_amax``) and then the scaled cast (``hp_tensor_and_scale_to_float8``): two reads of
  the 16-bit tensor and one FP8 write, Constants.TORCHAO_CAST_BYTES_PER_ELEMENT (5 B). Under
  torch.compile identical casts of one tensor in one graph are one kernel (inductor CSE), so a
  tensor shared by several linears (wq/wk/wv, w1/w3) is cast once, as the fused GEMM lists of
  :mod:`planner.cost.compute` count it. By recipe:

  - ``tensorwise``: one scale per tensor, so the gradient's two casts are one (plus a 1-byte
    transposed copy for the weight-gradient GEMM, which takes its first operand row-major:
    torch._scaled_mm); with ``enable_fsdp_float8_all_gather`` the weights are cast on their
    shard before the FSDP all-gather (``precompute_float8_dynamic_scale_for_fsdp``: one amax
    pass a step) and arrive as FP8, not cast here. torchao's Float8 tensor-parallel plan (inputs
    cast before their all-gather) is not what torchtitan 0.2.2 or 0.3.0 runs: 0.2.2 enables it on
    ``"float8" in model.converters`` (models/llama3/infra/parallelize.py), which its registered
    name ``quantize.linear.float8`` never matches, and 0.3.0 has no such plan.
  - ``rowwise``: per-row scales, every cast its own; the forward GEMM runs torch's CUTLASS
    row-wise kernel with fast accumulation, Constants.TORCHAO_ROWWISE_GEMM_EFFICIENCY of the
    tensor-wise cuBLAS kernel (pytorch/pytorch#147971); the backward GEMMs use slow accumulation,
    for which torchao calls the tensor-wise cuBLAS kernel and rescales the output afterwards
    (float8_ops.py addmm_float8_unwrapped: ``output *= post_inverse_scale``): one 16-bit read and
    write of each backward GEMM's output.
  - ``rowwise_with_gw_hp``: as rowwise, but the weight gradient in 16-bit (no column casts; the
    weight for the input gradient is cast tensor-wise, config.py ``ROWWISE_WITH_GW_HP``).
"""

from __future__ import annotations

from planner.cost.constants import Constants
from planner.specs import GpuSpec

__all__ = ["fp8_quant_time", "torchao_gemm_factors"]


def _stream(nbytes: float, gpu: GpuSpec, C: Constants) -> float:
    return nbytes / (gpu.hbm_bandwidth_bytes_per_s * C.HBM_STREAM_EFFICIENCY) + C.ELEMENTWISE_KERNEL_OVERHEAD_S


def fp8_quant_time(gemms: list, gpu: GpuSpec, C: Constants, batch: float = 1.0, scheme: str = "te") -> tuple[float, float]:
    """(fwd, bwd) seconds of the FP8 casts of GEMMs (m tokens, n out, k in), ``batch`` groups
    each (local experts), under ``scheme`` ("te", or "torchao-<recipe>", with "+fsdp8" where the
    weights arrive in FP8 from the FSDP all-gather, then "+tp8" where tensor parallelism gathers
    activations in FP8; module docstring)."""
    scheme, _, tail = scheme.partition("+")
    weights_gathered_fp8 = "fsdp8" in tail.split("+")  # "+tp8" (FP8 TP gathers) may follow
    if scheme in ("", "te"):
        b = C.FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT
        return (sum(_stream(b * m * k * batch, gpu, C) for m, n, k in gemms),
                sum(_stream(b * m * n * batch, gpu, C) for m, n, k in gemms))
    recipe = scheme.removeprefix("torchao-")
    c = C.TORCHAO_CAST_BYTES_PER_ELEMENT
    fwd = bwd = 0.0
    for m, n, k in gemms:
        x, g, w = m * k * batch, m * n * batch, n * k * batch  # input, output gradient, weight elements
        if recipe == "tensorwise":
            wf = 0.0 if weights_gathered_fp8 else c * w
            f = c * x + wf
            b = c * x + (c + 2.0) * g + wf  # the input again, the gradient once and its transposed copy, the weight again
        elif recipe == "rowwise":
            f = c * (x + w)
            b = c * (2 * g + x + w) + 4.0 * (x + w)  # four casts; rescale of the input- and weight-gradient outputs
        elif recipe == "rowwise_with_gw_hp":
            f = c * (x + w)
            b = c * (g + w) + 4.0 * x  # the input-gradient GEMM rescaled; the weight gradient in 16-bit
        else:
            raise ValueError(f"unknown FP8 cast scheme {scheme!r}")
        fwd += _stream(f, gpu, C) + C.ELEMENTWISE_KERNEL_OVERHEAD_S  # the amax reduction is a kernel of its own
        bwd += _stream(b, gpu, C) + 3 * C.ELEMENTWISE_KERNEL_OVERHEAD_S
    return fwd, bwd


def torchao_gemm_factors(scheme: str, C: Constants) -> tuple[float, bool]:
    """(forward GEMM time factor, weight gradient in 16-bit) of a torchao recipe: the row-wise
    CUTLASS kernel's time relative to the tensor-wise kernel's in forward, and whether the
    weight-gradient GEMM runs in 16-bit (``rowwise_with_gw_hp``)."""
    scheme = scheme.partition("+")[0]
    recipe = scheme.removeprefix("torchao-") if scheme.startswith("torchao-") else ""
    if recipe in ("rowwise", "rowwise_with_gw_hp"):
        return 1.0 / C.TORCHAO_ROWWISE_GEMM_EFFICIENCY, recipe == "rowwise_with_gw_hp"
    return 1.0, False
