"""Typer option types shared by ``estimate`` and ``plan`` (declared once)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

__all__ = [
    "ModelOpt", "GpuOpt", "GpusOpt", "GpnOpt", "ClusterOpt", "NicOpt", "NicsOpt", "NetOpt", "SeqOpt", "GbsOpt",
    "PrecOpt", "GradOpt", "Fp8RecipeOpt", "Fp8GatherOpt", "Fp8TpGatherOpt", "CrossEntropyOpt", "EngineOpt", "AttnOpt", "TpOpt", "PpOpt", "DpOpt", "CpOpt", "EpOpt", "VppOpt", "MbOpt", "RecOpt", "SpOpt",
    "ZeroOpt", "ScenarioOpt", "IdOpt", "JsonOpt", "GraphOpt", "DispatcherOpt",
]

ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="Model preset id, a YAML model file, or a Hugging Face config.json.")]
GpuOpt = Annotated[Optional[str], typer.Option("--gpu", help="GPU preset id (planner hw list).")]
GpusOpt = Annotated[Optional[int], typer.Option("--gpus", "-n", help="Total number of GPUs.")]
GpnOpt = Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (default: the GPU preset's).")]
ClusterOpt = Annotated[Optional[str], typer.Option("--cluster", help="Cluster preset id or YAML file (replaces --gpu/--nic-*).")]
NicOpt = Annotated[Optional[float], typer.Option("--nic-gbps", help="Gb/s per NIC between nodes (default: the GPU's reference node, e.g. DGX A100 200, DGX H100 400).")]
NicsOpt = Annotated[Optional[int], typer.Option("--nics-per-node", help="NICs per node (default: the GPU's reference node, e.g. 8; DGX-1 V100 4).")]
NetOpt = Annotated[Optional[str], typer.Option("--network", help="infiniband | roce | ethernet | omnipath.")]
SeqOpt = Annotated[Optional[int], typer.Option("--seq-len", "-s", help="Sequence length in tokens.")]
GbsOpt = Annotated[Optional[int], typer.Option("--global-batch-size", "-b", help="Sequences per optimizer step.")]
PrecOpt = Annotated[Optional[str], typer.Option("--precision", help="bf16 | fp16 | fp8.")]
MarginOpt = Annotated[Optional[float], typer.Option("--memory-margin", help="Fraction of GPU memory a plan leaves free (default 0.05: the memory model's largest under-prediction on published runs).")]
Fp8RecipeOpt = Annotated[Optional[str], typer.Option("--fp8-recipe", help="FP8 scaling recipe with --precision fp8: auto (what the planner's launch files write: delayed on megatron-core, rowwise on torchtitan) | delayed | tensorwise | mxfp8 (Blackwell) | blockwise (megatron-core) | rowwise | rowwise_with_gw_hp | tensorwise (torchtitan).")]
Fp8GatherOpt = Annotated[Optional[bool], typer.Option("--fp8-param-gather/--no-fp8-param-gather", help="FP8 primary weights, all-gathered in FP8 (Megatron --fp8-param-gather; torchtitan tensorwise enable_fsdp_float8_all_gather). Unset: the engine's launch default (off on megatron-core, on for torchtitan tensorwise).")]
Fp8TpGatherOpt = Annotated[Optional[bool], typer.Option("--fp8-tp-gather/--no-fp8-tp-gather", help="Tensor parallelism all-gathers activations in FP8 (torchao's Float8 TP styles, tensorwise recipe, torchtitan engine). For pricing runs that had it: torchtitan 0.2.2 and 0.3.0 never turn it on, so no launch file is written for it. Unset: off.")]
CrossEntropyOpt = Annotated[Optional[str], typer.Option("--cross-entropy", help="The loss's cross-entropy kernels, priced by the bytes they move (planner engines show NAME): auto = the engine's default (unfused on the Megatron engines, torch on torchtitan and DeepSpeed) | unfused (Megatron's eager vocab-parallel cross entropy) | native (Megatron --cross-entropy-loss-fusion; written by the launch files) | te (Transformer Engine's kernel: priced, but Megatron-LM refuses it, so no launch file) | torch (F.cross_entropy on fp32 logits; loss_parallel under TP) | compiled (torchtitan: the same under torch.compile, 'loss' in compile.components; written by the launch files).")]
GradOpt = Annotated[Optional[str], typer.Option("--grad-reduce", help="Gradient accumulation/reduction dtype: auto (fp32 for bf16/fp8, fp16 for fp16) | fp32 | bf16.")]
EngineOpt = Annotated[Optional[str], typer.Option("--engine", "-e", help="Training engine: megatron-core (default) | megatron-legacy | deepspeed | megatron-deepspeed | torchtitan | megatron-zb (planner engines list).")]
AttnOpt = Annotated[Optional[str], typer.Option("--attention", help="flash | fa2 | fa1 | unfused | auto (auto: the engine's kernel where the GPU has it; fa2: FlashAttention-2 kernels, e.g. PyTorch SDPA's flash backend on Hopper; fa1: flash-attn 1.x, Megatron-DeepSpeed's --use-flash-attn).")]
TpOpt = Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel degree.")]
PpOpt = Annotated[Optional[int], typer.Option("--pp", help="Pipeline-parallel degree.")]
DpOpt = Annotated[Optional[int], typer.Option("--dp", help="Data-parallel degree.")]
CpOpt = Annotated[Optional[int], typer.Option("--cp", help="Context-parallel degree.")]
EpOpt = Annotated[Optional[int], typer.Option("--ep", help="Expert-parallel degree (MoE).")]
LpsOpt = Annotated[Optional[str], typer.Option("--layers-per-stage", help="Transformer layers of each pipeline stage, comma-separated (e.g. 19,21,21,19; default: the engine's split).")]
EtpOpt = Annotated[Optional[int], typer.Option("--etp", help="Expert tensor-parallel degree (MoE; default: the engine's).")]
VppOpt = Annotated[Optional[int], typer.Option("--vpp", help="Virtual pipeline stages per rank (interleaved 1F1B).")]
MbOpt = Annotated[Optional[int], typer.Option("--micro-batch-size", "--mb", help="Micro-batch size in sequences.")]
GraphOpt = Annotated[Optional[str], typer.Option("--cuda-graph", help="CUDA graphs: none | layer (Megatron-core --cuda-graph-impl local) | full_iteration (default none; not searched).")]
DispatcherOpt = Annotated[Optional[str], typer.Option("--moe-dispatcher", help="MoE token dispatcher: alltoall | deepep | hybridep (Megatron-core flex; default alltoall; not searched).")]
SchedOpt = Annotated[Optional[str], typer.Option("--schedule", help="Pipeline schedule: 1f1b | interleaved | gpipe | zb-h1 | zb-h2 | zb-v | dualpipe (those the engine runs); plan takes a comma list to search among.")]


def check_schedules(names: tuple[str, ...], engine: str | None) -> None:
    """Every schedule of a ``--schedule`` list must be one the engine runs (under ``--engine
    auto``, one of the engines it searches): a listed schedule is never dropped silently."""
    from planner.engines import AUTO, AUTO_ENGINES, ENGINE_NAMES, get_engine  # noqa: PLC0415
    from planner.errors import InputError  # noqa: PLC0415

    engines = [get_engine(e) for e in AUTO_ENGINES] if (engine or "").lower() == AUTO else [get_engine(engine)]
    runs = {s for e in engines for s in e.schedules}
    bad = [s for s in names if s not in runs]
    if bad:
        who = "the engines --engine auto searches run" if len(engines) > 1 else f"{engines[0].name} runs"
        hint = "; ".join(f"{s} runs on " + ", ".join(e.name for e in map(get_engine, ENGINE_NAMES) if s in e.schedules) for s in bad)
        raise InputError("--schedule", ",".join(bad), f"schedules {who} ({', '.join(sorted(runs))}); {hint}")


def schedule_name(name: str) -> str:
    """A ``--schedule`` entry in the planner's spelling: lower case, and torchtitan's
    (torch.distributed.pipelining) name of a schedule the planner prices exactly mapped to it
    (planner.emit.torchtitan.SCHEDULES: Interleaved1F1B, ZBVZeroBubble, DualPipeV)."""
    from planner.emit.torchtitan import SCHEDULES  # noqa: PLC0415

    key = name.strip().lower()
    return {v.lower(): k for k, v in SCHEDULES.items()}.get(key, key)


def schedule_list(flag: str | None) -> tuple[str | None, tuple[str, ...] | None]:
    """``--schedule`` of ``plan``: one schedule fixes it; a comma list (``1f1b,zb-v``) is the set the
    search tries. Returns (fixed schedule or None, schedules to try or None)."""
    if flag is None or "," not in flag:
        return (None if flag is None else schedule_name(flag)), None
    from planner.cost.step import SCHEDULE_FORMS  # noqa: PLC0415
    from planner.errors import InputError  # noqa: PLC0415

    names = tuple(dict.fromkeys(schedule_name(x) for x in flag.split(",") if x.strip()))
    bad = [x for x in names if x not in SCHEDULE_FORMS]
    if bad or not names:
        raise InputError("--schedule", flag, "one of " + " | ".join(SCHEDULE_FORMS) + ", or a comma list of them")
    return None, names
RecOpt = Annotated[Optional[str], typer.Option("--recompute", help="none | selective | full.")]
SpOpt = Annotated[Optional[bool], typer.Option("--sequence-parallel/--no-sequence-parallel", help="Megatron sequence parallelism.")]
OgrOpt = Annotated[Optional[bool], typer.Option("--overlap-grad-reduce/--no-overlap-grad-reduce", help="Gradient reduction beside the backward (Megatron --overlap-grad-reduce, DeepSpeed overlap_comm; default: the engine's launch files').")]
OpgOpt = Annotated[Optional[bool], typer.Option("--overlap-param-gather/--no-overlap-param-gather", help="ZeRO-1/2 weight all-gather beside the next forward (Megatron --overlap-param-gather; default: the engine's launch files').")]
TpOverlapOpt = Annotated[Optional[bool], typer.Option("--tp-comm-overlap/--no-tp-comm-overlap", help="TP all-gather/reduce-scatter pipelined with the GEMMs (Megatron --tp-comm-overlap, torchtitan async TP; default: the engine's launch files').")]
AsyncTpOpt = Annotated[Optional[bool], typer.Option("--async-tp-allreduce/--no-async-tp-allreduce", help="Backward TP all-reduce overlapped with the weight-gradient GEMM (Megatron's default with CUDA_DEVICE_MAX_CONNECTIONS=1; default: the engine's).")]
ZeroOpt = Annotated[Optional[int], typer.Option("--zero", help="0 none, 1 optimizer (distributed optimizer), 2 +gradients, 3 +weights.")]
ScenarioOpt = Annotated[Optional[str], typer.Option("--scenario", help="A runs/scenario file (schema planner-runs/1).")]
IdOpt = Annotated[Optional[str], typer.Option("--id", help="Run id inside --scenario.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]


def check_margin(value: float | None) -> float | None:
    """``--memory-margin``: a fraction in [0, 1) of GPU memory kept free (InputError otherwise)."""
    from planner.errors import InputError  # noqa: PLC0415

    if value is None:
        return None
    if not (0.0 <= value < 1.0):
        raise InputError("--memory-margin", value, "a fraction of GPU memory in [0, 1), e.g. 0.05")
    return float(value)


def parse_layers(text: str | None) -> tuple[int, ...] | None:
    """``--layers-per-stage 19,21,21,19`` as a tuple (None when not given)."""
    from planner.errors import InputError  # noqa: PLC0415

    if text is None:
        return None
    try:
        out = tuple(int(x) for x in text.replace(" ", "").split(","))
    except ValueError:
        raise InputError("--layers-per-stage", text, "comma-separated whole numbers of layers, one per pipeline stage (e.g. 19,21,21,19)") from None
    if any(x < 0 for x in out):
        raise InputError("--layers-per-stage", text, "layer counts >= 0")
    return out

