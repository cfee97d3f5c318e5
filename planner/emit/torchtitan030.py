"""torchtitan 0.3.0: a Python config module and its ``--module/--config`` command.

0.3.0 has no TOML: ``torchtitan.train`` takes ``--module <importable module> --config <function>``
and calls the function for a ``Trainer.Config`` (torchtitan/config/manager.py:19-159; a fully
qualified module path is tried as itself, :125-141). The emitted module starts from the
upstream registry function of the model family (``torchtitan/models/<name>/config_registry.py``:
data loader, optimizer, LR schedule, checkpointing as torchtitan ships them), swaps in the
plan's flavor (``model_registry(flavor)``) and sets parallelism, training, activation
checkpointing and compile from the settings of :func:`planner.emit.torchtitan.titan_settings`.
Rules of 0.3.0 (Trainer.Config.__post_init__, trainer.py:118-210, checked at parse time): a
pipeline or expert parallelism needs ``training.disable_cuda_graphs = True`` (written always: the
planner prices eager launches, and 0.3.0 otherwise graphs the whole step);
``expert_tensor_parallel_degree`` is gone (configs.py:111-287).
"""

from __future__ import annotations

from planner.emit.common import LaunchSpec, PlanView, provenance_lines

__all__ = ["TITAN030_MODULE", "TITAN030_FUNCTION", "TITAN030_SCRIPT", "TORCHTITAN030_TARGET", "torchtitan030_module",
           "torchtitan030_launch_spec", "torchtitan030_files"]

TORCHTITAN030_TARGET = "torchtitan 0.3.0 config module (--module/--config)"
TITAN030_MODULE = "planner_torchtitan_config"  # the file planner_torchtitan_config.py, on PYTHONPATH
TITAN030_FUNCTION = "planner_config"
TITAN030_SCRIPT = "torchtitan030_launch.sh"
# The registry function each module's config starts from (dense / MoE), torchtitan 0.3.0.
# The flavor's own registry function where 0.3.0 ships one (its optimizer and schedule are that
# size's: llama3_70b lr 1.5e-4, ...), else the family's above.
_FLAVOR_BASE = {("llama3", "8B"): "llama3_8b", ("llama3", "70B"): "llama3_70b", ("llama3", "405B"): "llama3_405b",
                ("qwen3", "0.6B"): "qwen3_0_6b", ("qwen3", "1.7B"): "qwen3_1_7b", ("qwen3", "14B"): "qwen3_14b",
                ("qwen3", "32B"): "qwen3_32b", ("qwen3", "30B-A3B"): "qwen3_30b_a3b", ("deepseek_v3", "16B"): "deepseek_v3_16b",
                ("deepseek_v3", "671B"): "deepseek_v3_671b"}  # models/<name>/config_registry.py
_BASE = {("llama3", False): "llama3_8b", ("qwen3", False): "qwen3_14b", ("qwen3", True): "qwen3_30b_a3b",
         ("deepseek_v3", True): "deepseek_v3_16b"}


def _kwargs(d: dict) -> str:
    return ",\n        ".join(f"{k}={val!r}" for k, val in d.items())


def torchtitan030_module(v: PlanView, s: dict, notes: list[str]) -> str:
    """The text of planner_torchtitan_config.py for settings ``s`` (torchtitan 0.3.0)."""
    fl = s["flavor"]
    base = _FLAVOR_BASE.get((fl.name, fl.flavor)) or _BASE[(fl.name, fl.moe is not None)]
    head = provenance_lines(v, "torchtitan", TORCHTITAN030_TARGET) + notes
    recipe = "" if s["fp8_recipe"] in ("", "rowwise") else f", recipe_name={s['fp8_recipe']!r}"  # 0.3.0's default is rowwise
    reg = f"model_registry({fl.flavor!r}" + (f", converters=[Float8LinearConverter.Config(filter_fqns=['lm_head']{recipe})])" if s["fp8"] else ")")
    par = {"data_parallel_replicate_degree": s["dp_replicate"], "data_parallel_shard_degree": s["dp_shard"],
           "fsdp_reshard_after_forward": s["reshard"], "tensor_parallel_degree": s["tp"],
           "enable_sequence_parallel": s["sequence_parallel"], "pipeline_parallel_degree": s["pp"],
           "context_parallel_degree": s["cp"], "expert_parallel_degree": s["ep"]}
    if s["pp"] > 1:
        par.update(pipeline_parallel_schedule=s["schedule"], pipeline_parallel_microbatch_size=s["microbatch_size"])
        if s["parts"] is not None:
            par["module_fqns_per_model_part"] = s["parts"]
        else:
            par.update(pipeline_parallel_layers_per_stage=s["layers_per_stage"],
                       pipeline_parallel_first_stage_less_layers=0, pipeline_parallel_last_stage_less_layers=0)
    training = {"local_batch_size": s["local_batch_size"], "global_batch_size": s["global_batch_size"], "seq_len": s["seq_len"],
                "steps": 1000, "mixed_precision_param": "bfloat16", "mixed_precision_reduce": "float32"}
    # always: the planner prices eager launches (torchtitan 0.3.0 graphs the step by default, and
    # refuses its graph with a pipeline or a host-syncing expert dispatch: trainer.py:183-210)
    training["disable_cuda_graphs"] = True
    ac = {"none": "None", "full": "FullAC.Config()", "selective": "SelectiveAC.Config()"}[s["ac"]]
    lines = [
        '"""' + "\n".join(head).replace('"""', "'''") + '\n"""',
        "",
        "from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss",
        "from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401",
        "from torchtitan.models.common.config_utils import decoder_vocab_size",
        f"from torchtitan.models.{fl.name} import model_registry",
        f"from torchtitan.models.{fl.name}.config_registry import {base} as _upstream",
    ]
    if s["fp8"]:
        lines.append("from torchtitan.components.quantization import Float8LinearConverter  # needs SM89+ when the config is built")
    lines += [
        "",
        "",
        f"def {TITAN030_FUNCTION}():",
        f'    """{fl.name} {fl.flavor} as planned (plan rank {v.rank})."""',
        "    cfg = _upstream()",
        f"    cfg.model_spec = {reg}",
        "    cfg.loss = ChunkedLossWrapper.Config(",
        "        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(cfg.model_spec)))",
        f"    cfg.hf_assets_path = {s['hf_assets_path']!r}",
        f"    cfg.parallelism = ParallelismConfig(\n        {_kwargs(par)})",
        f"    cfg.training = TrainingConfig(\n        {_kwargs(training)})",
        f"    cfg.activation_checkpoint = {ac}",
        (f"    cfg.compile = CompileConfig(enable=True, components={s['compile']!r}"
         + (", enable_async_tensor_parallel=True)" if s["async_tp"] else ")")) if s["compile"]
        else "    cfg.compile = CompileConfig(enable=False)",
        "    return cfg",
        "",
    ]
    return "\n".join(lines)


def torchtitan030_launch_spec(v: PlanView) -> LaunchSpec:
    return LaunchSpec(program=["-m", "torchtitan.train"], arg_lines=[["--module", TITAN030_MODULE, "--config", TITAN030_FUNCTION]],
                      tail=['"$@"'])


def torchtitan030_files(v: PlanView, s: dict, notes: list[str], script) -> dict[str, str]:
    """planner_torchtitan_config.py and torchtitan030_launch.sh (``script`` renders the launcher)."""
    text = torchtitan030_module(v, s, notes)
    compile(text, f"{TITAN030_MODULE}.py", "exec")  # the module must at least be valid Python
    launch = script(v, torchtitan030_launch_spec(v), TORCHTITAN030_TARGET,
                    "anywhere with torchtitan 0.3.0 installed (pip install torchtitan==0.3.0)",
                    notes)
    here = 'export PYTHONPATH="$(cd "$(dirname "$0")" && pwd):${PYTHONPATH:-}"  # for --module ' + TITAN030_MODULE + "\n"
    launch = launch.replace("export PYTORCH_ALLOC_CONF", here + "export PYTORCH_ALLOC_CONF", 1)
    return {f"{TITAN030_MODULE}.py": text, TITAN030_SCRIPT: launch}
