"""Training engines as first-class inputs: profiles (data) and policy (resolution, rules).

An engine is named explicitly (``--engine``, ``estimate(..., engine=...)``); the default is
:data:`DEFAULT_ENGINE` (``megatron-core``). Profiles live in ``planner/engines/profiles/*.yaml``,
each citing the engine's code: ``megatron-core`` (Megatron-LM, NeMo 2, Megatron-Bridge),
``megatron-legacy`` (the 2020-2021 engine of the SC21 runs), ``deepspeed`` (ZeRO and its
pipeline engine), ``megatron-deepspeed`` and ``torchtitan`` (FSDP2, DTensor TP, pipelining).

>>> from planner.engines import ENGINE_NAMES, get_engine
>>> "torchtitan" in ENGINE_NAMES
True
>>> get_engine("deepspeed").max_zero_with_pp
1
"""

from planner.engines.policy import (a2a_overlap_runs, a2a_overlap_why, attention_kernel, check_engine, cp_attention_why, cuda_graph_why, default_etp, dp_overlap_why, flash_kernel_why, flex_dispatcher_why, default_split, engine_flags,
                                    fp8_casts, fp8_gather_bytes, fp8_gathers, fp8_recipe, interleaving_ok, least_layers, mtp_rule, precision_rule, resolve, resolve_job, supports_flash, tp_overlap_why)
from planner.engines.profile import AUTO, AUTO_ENGINES, DEFAULT_ENGINE, ENGINE_NAMES, Engine, Sharding, engine_names, get_engine

__all__ = ["AUTO", "AUTO_ENGINES", "DEFAULT_ENGINE", "ENGINE_NAMES", "Engine", "Sharding", "a2a_overlap_runs", "a2a_overlap_why", "attention_kernel", "check_engine", "cp_attention_why", "default_etp", "default_split", "engine_flags", "engine_names",
           "dp_overlap_why", "flash_kernel_why", "flex_dispatcher_why", "cuda_graph_why", "fp8_casts", "fp8_gather_bytes", "fp8_gathers", "fp8_recipe", "resolve_job",
           "get_engine", "interleaving_ok", "least_layers", "mtp_rule", "precision_rule", "resolve", "supports_flash", "tp_overlap_why"]
