"""Launch configurations from a plan document: Megatron-LM, DeepSpeed, torchtitan, SLURM.

``emit_files(plan_doc, engine, rank=1)`` returns {file name: content};
``write_files(files, out_dir, force=False)`` writes them all or none.
"""

from planner.emit.bundle import ENGINES, emit_bundle, emit_files
from planner.emit.common import write_files

__all__ = ["ENGINES", "emit_bundle", "emit_files", "write_files"]
