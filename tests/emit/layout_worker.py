"""Worker for test_layout_dist.py, started by torchrun (gloo backend, CPU).

Builds every process group the plan's layout names (planner.emit.layout) and checks them with
real collectives: all_reduce of the rank ids must equal the sum of the group's ranks, and
all_gather must return exactly the group's ranks in layout order; each rank also checks that
its coordinates agree with its position in every group. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from planner.emit.layout import layout_from_plan

__all__: list[str] = []

TOKENS = {"tp": "tp", "cp": "cp", "dp": "dp", "pp": "pp", "ep": "expert:ep", "edp": "expert:dp", "dp-cp": "dp-cp"}


def main() -> int:
    plan_path, rank_in_doc = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    me, world = dist.get_rank(), dist.get_world_size()
    layout = layout_from_plan(json.load(open(plan_path)), rank_in_doc)
    assert world == layout.world, (world, layout.world)
    coord = layout.coords(me)
    checked = {}
    for name, token in TOKENS.items():
        for ranks in layout.groups(token):
            group = dist.new_group(ranks)  # every rank creates every group, in the same order
            if me not in ranks:
                continue
            t = torch.tensor([me], dtype=torch.int64)
            dist.all_reduce(t, group=group)
            assert int(t) == sum(ranks), (name, ranks, int(t))
            out = [torch.zeros(1, dtype=torch.int64) for _ in ranks]
            dist.all_gather(out, torch.tensor([me], dtype=torch.int64), group=group)
            assert [int(x) for x in out] == ranks, (name, ranks, out)
            if name in ("tp", "cp", "dp", "pp", "ep", "edp"):
                assert ranks.index(me) == getattr(coord, name), (name, ranks, coord)
            checked[name] = ranks
    dist.barrier()
    out_dir = os.environ.get("LAYOUT_OUT")
    if out_dir:
        with open(os.path.join(out_dir, f"rank{me}.json"), "w") as fh:
            json.dump({"rank": me, "coord": coord._asdict(), "groups": checked}, fh)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
