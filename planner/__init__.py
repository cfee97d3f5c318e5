"""planner: a parallelism auto-planner for training large models.

The same cost model and search the CLI uses (one pricing path: every door calls
:func:`estimate`)::

    >>> import planner
    >>> model = planner.load_model("llama3.1-70b")
    >>> cluster = planner.make_cluster("h100-sxm5-80gb", 64)
    >>> job = planner.Job(seq_len=8192, global_batch_size=256, precision="bf16")
    >>> est = planner.estimate(model, cluster, job, planner.ParallelConfig(tp=8, pp=4, dp=2, recompute="selective"))
    >>> est.engine, est.parallel.sequence_parallel       # the engine resolved what was left unset
    ('megatron-core', True)
    >>> best = planner.plan(model, cluster, job, top_k=3).plans[0]
    >>> best.estimate.step_time_s <= est.step_time_s
    True

Engines are explicit (``engine="torchtitan"``; :data:`ENGINE_NAMES`), constants are values
(``constants=DEFAULT_CONSTANTS.replace(...)``).
"""

__version__ = "0.2.0"

from planner.calibration.validate import validate_runs
from planner.cost.collectives import CollectiveResult
from planner.cost.constants import DEFAULT_CONSTANTS, Constants
from planner.cost.estimate import estimate
from planner.cost.flops import param_count, step_model_flops
from planner.cost.network import group_collective as collective
from planner.cost.result import Estimate
from planner.engines import DEFAULT_ENGINE, ENGINE_NAMES, Engine, get_engine, resolve
from planner.errors import InputError, NoFeasiblePlan, SolverFailure
from planner.io.loaders import load_cluster, load_gpu, load_model, load_runs, make_cluster
from planner.search.plan import Plan, PlanResult, plan
from planner.search.space import SearchOptions
from planner.specs import ClusterSpec, GpuSpec, Job, ModelSpec, MoESpec, ParallelConfig

__all__ = [
    "__version__",
    "ClusterSpec",
    "CollectiveResult",
    "Constants",
    "DEFAULT_CONSTANTS",
    "DEFAULT_ENGINE",
    "ENGINE_NAMES",
    "Engine",
    "Estimate",
    "GpuSpec",
    "InputError",
    "Job",
    "ModelSpec",
    "MoESpec",
    "NoFeasiblePlan",
    "ParallelConfig",
    "Plan",
    "PlanResult",
    "SearchOptions",
    "SolverFailure",
    "collective",
    "estimate",
    "get_engine",
    "load_cluster",
    "load_gpu",
    "load_model",
    "load_runs",
    "make_cluster",
    "param_count",
    "plan",
    "resolve",
    "step_model_flops",
    "validate_runs",
]
