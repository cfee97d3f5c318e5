"""planner: a parallelism auto-planner for training large models.

The same cost model and search the CLI uses::

    import planner
    model = planner.load_model("llama3.1-70b")
    cluster = planner.make_cluster("h100-sxm5-80gb", 64)
    job = planner.Job(seq_len=8192, global_batch_size=256, precision="bf16")
    est = planner.estimate(model, cluster, job, planner.ParallelConfig(tp=8, pp=4, dp=2, micro_batch_size=1, recompute="selective", sequence_parallel=True, zero=1))
    best = planner.plan(model, cluster, job, top_k=5).plans[0]
"""

__version__ = "0.1.0"

from planner.cost.collectives import collective
from planner.cost.estimate import estimate
from planner.cost.flops import param_count, step_model_flops
from planner.cost.result import Estimate
from planner.errors import InputError, NoFeasiblePlan, SolverFailure
from planner.io.loaders import load_cluster, load_gpu, load_model, load_runs, make_cluster
from planner.search.plan import Plan, PlanResult, plan
from planner.search.space import SearchOptions
from planner.specs import ClusterSpec, GpuSpec, Job, ModelSpec, MoESpec, ParallelConfig
from planner.calibration.validate import validate_runs

__all__ = [
    "__version__",
    "ClusterSpec",
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
    "load_cluster",
    "load_gpu",
    "load_model",
    "load_runs",
    "make_cluster",
    "param_count",
    "plan",
    "step_model_flops",
    "validate_runs",
]
