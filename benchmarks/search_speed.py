"""Wall time of ``planner plan --top 10 --json`` on the default job and five large scenarios, process start included.

Each scenario runs ``python -m planner plan ... --json`` as a fresh subprocess ``--repeats``
times (default 5) and reports the median wall time; the child's CPU time (user + system)
is shown too, because wall time on a shared machine includes waiting for a core. The goal
is under 2 s of wall time per scenario.

    python benchmarks/search_speed.py            # table on stdout
    python benchmarks/search_speed.py --repeats 3 --json out.json
    python benchmarks/search_speed.py --engines  # the default job on the other engines instead

``--engines`` times the default job's search on torchtitan and DeepSpeed, whose spaces are
larger (FSDP2's ZeRO 0/2/3 and HSDP shard degrees, five pipeline schedules), against the same
2 s goal.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 2.0

SCENARIOS = [
    ("the default job: Llama 3.1 70B, 64 x H100, seq 8192, gbs 256 (planner plan)", []),
    ("GPT-3 175B, 512 x A100-80GB, seq 2048, gbs 1536",
     ["--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "512", "-s", "2048", "-b", "1536"]),
    ("GPT-3 175B, 1,024 x A100-80GB, seq 2048, gbs 1536",
     ["--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024", "-s", "2048", "-b", "1536"]),
    ("GPT 1T (models/gpt-1t.yaml), 3,072 x A100-80GB, seq 2048, gbs 3072",
     ["--model", str(ROOT / "models" / "gpt-1t.yaml"), "--gpu", "a100-sxm4-80gb", "--gpus", "3072", "-s", "2048", "-b", "3072"]),
    ("Llama 3.1 405B, 16,384 x H100, seq 8192, gbs 2048",
     ["--model", "llama3.1-405b", "--gpu", "h100-sxm5-80gb", "--gpus", "16384", "-s", "8192", "-b", "2048"]),
    ("GPT 1T (models/gpt-1t.yaml), 131,072 x H100, seq 2048, gbs 16384",
     ["--model", str(ROOT / "models" / "gpt-1t.yaml"), "--gpu", "h100-sxm5-80gb", "--gpus", "131072", "-s", "2048", "-b", "16384"]),
]


ENGINE_SCENARIOS = [
    ("the default job on torchtitan (planner plan --engine torchtitan)", ["--engine", "torchtitan"]),
    ("the default job on DeepSpeed (planner plan --engine deepspeed)", ["--engine", "deepspeed"]),
]


def run_once(args: list[str]) -> tuple[float, float, dict]:
    """(wall seconds, child CPU seconds, parsed JSON) of one ``planner plan`` process."""
    cmd = [sys.executable, "-m", "planner", "plan", *args, "--top", "10", "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return wall, cpu, json.loads(proc.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", dest="json_out", help="also write the results to this file")
    ap.add_argument("--engines", action="store_true", help="time the default job on torchtitan and DeepSpeed instead")
    a = ap.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average {load:.1f} at start, "
          f"median of {a.repeats} runs", file=sys.stderr)
    rows = []
    for name, args in (ENGINE_SCENARIOS if a.engines else SCENARIOS):
        walls, cpus, doc = [], [], None
        for _ in range(a.repeats):
            w, c, doc = run_once(args)
            walls.append(w)
            cpus.append(c)
            print(f"  {name}: {w:.2f} s", file=sys.stderr)
        best = doc["plans"][0]
        par = best["parallel"]
        rows.append({
            "scenario": name,
            "wall_median_s": statistics.median(walls),
            "wall_min_s": min(walls),
            "cpu_median_s": statistics.median(cpus),
            "in_process_search_s": doc["search"]["seconds"],
            "candidates": doc["search"]["candidates"],
            "evaluated": doc["search"]["evaluated"],
            "best": f"tp{par['tp']} pp{par['pp']} dp{par['dp']} cp{par['cp']} vpp{par['vpp']} mb{par['micro_batch_size']} "
                    f"{par['recompute']} z{par['zero']}",
            "best_step_s": best["predicted"]["step_time_s"],
        })
    print("| scenario | wall median (s) | wall min (s) | CPU median (s) | search in-process (s) | candidates | evaluated | best plan | step (s) | < 2 s |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|:-:|")
    for r in rows:
        ok = "yes" if r["wall_median_s"] < GOAL_S else "no"
        print(f"| {r['scenario']} | {r['wall_median_s']:.2f} | {r['wall_min_s']:.2f} | {r['cpu_median_s']:.2f} | "
              f"{r['in_process_search_s']:.2f} | {r['candidates']:,} | {r['evaluated']:,} | {r['best']} | {r['best_step_s']:.2f} | {ok} |")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"load_average": load, "repeats": a.repeats, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
