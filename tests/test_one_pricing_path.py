"""One pricing path: for the same configuration, the API's ``planner.estimate``, the CLI's
``planner estimate --json``, ``planner validate`` on a runs file holding the full configuration,
and the entry ``planner.plan`` returns with every searched field fixed agree to 1e-9 relative on
step time and peak memory.

220 random valid configurations (dense and MoE models, every engine profile), drawn from each
engine's own candidate space so that every one is a layout that engine runs. The fields the
engine decides (sequence parallelism, attention kernel, overlaps, schedule) are fixed in some
draws and left to the engine's default in others ("partly fixed"): every door resolves them
the same way (planner.engines.resolve).
"""

from __future__ import annotations

import contextlib
import io
import json
import random

import pytest

import planner
from planner.calibration.validate import validate_runs
from planner.cli.app import main
from planner.engines import ENGINE_NAMES, get_engine
from planner.io.loaders import run_from_dict
from planner.search.space import SearchOptions, candidates
from planner.specs import ModelSpec, MoESpec

N = 220
REL = 1e-9
SEED = 20261201
GPUS = ["a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "gb200"]


def _model(rng: random.Random) -> ModelSpec:
    layers, heads = rng.choice([4, 6, 8, 12]), rng.choice([8, 16])
    hidden = rng.choice([512, 1024, 2048])
    gqa = rng.random() < 0.5
    moe = None
    if rng.random() < 0.35:
        moe = MoESpec(experts=rng.choice([4, 8]), top_k=rng.choice([1, 2]), expert_ffn_hidden=rng.choice([512, 1024]),
                      dense_layers=rng.choice([0, 1]))
    llama = rng.random() < 0.6
    return ModelSpec(name=f"m{layers}x{hidden}", layers=layers, hidden=hidden, heads=heads, kv_heads=heads // 4 if gqa else heads,
                     ffn_hidden=4 * hidden, vocab=rng.choice([1024, 32000]), mlp="swiglu" if llama else "gelu",
                     tied_embeddings=not llama, bias=not llama, norm="rmsnorm" if llama else "layernorm", moe=moe)


def _draw(rng: random.Random):
    """(engine, model, cluster, job, resolved candidate) for a valid configuration."""
    while True:
        engine = rng.choice(sorted(ENGINE_NAMES))
        model = _model(rng)
        gpu = rng.choice(GPUS)
        n = rng.choice([4, 8, 16, 32])
        cluster = planner.make_cluster(gpu, n)
        prec = rng.choice(["bf16", "bf16", "fp16"] + (["fp8"] if gpu not in ("a100-sxm4-80gb",) else []))
        job = planner.Job(seq_len=rng.choice([512, 1024, 2048]), global_batch_size=rng.choice([8, 16, 32]), precision=prec)
        opts = SearchOptions(engine=engine, max_micro_batch=4, max_vpp=4, max_cp=2, allow_tp_across_nodes=True)
        pars = list(candidates(model, cluster, job, opts))
        if pars:
            return engine, model, cluster, job, rng.choice(pars)


ENGINE_ONLY = ("sequence_parallel", "attention", "schedule", "tp_comm_overlap", "async_tp_allreduce", "overlap_grad_reduce",
               "overlap_param_gather")
CLI_FLAGS = {"tp": "--tp", "pp": "--pp", "dp": "--dp", "cp": "--cp", "ep": "--ep", "vpp": "--vpp", "micro_batch_size": "--mb",
             "recompute": "--recompute", "zero": "--zero"}


def _cases() -> list:
    rng = random.Random(SEED)
    fa2 = random.Random(SEED + 1)  # its own stream: the draws above stay the same
    out = []
    for _ in range(N):
        engine, model, cluster, job, cand = _draw(rng)
        if cand.attention == "flash" and "fa2" in get_engine(engine).attention_kernels and fa2.random() < 0.2:
            cand = cand.replace(attention="fa2")  # FlashAttention-2's kernels: never the default, so always given
        # Partly fixed: each engine-decided field is given (as the engine would resolve it, or
        # the candidate's value) or left None; the CLI-expressible ones are passed as flags.
        keep = {f: rng.random() < 0.5 for f in ENGINE_ONLY}
        if not cand.tp > 1:
            keep["sequence_parallel"] = False
        if cand.schedule not in ("1f1b", "interleaved"):
            keep["schedule"] = True  # the engine's default would be another schedule (1F1B / interleaved)
        if cand.attention == "fa2":
            keep["attention"] = True
        par = cand.replace(**{f: (getattr(cand, f) if keep[f] else None) for f in ENGINE_ONLY}, layers_per_stage=None)
        out.append((engine, model, cluster, job, par))
    return out


CASES = _cases()


def _api(engine, model, cluster, job, par):
    return planner.estimate(model, cluster, job, par, engine)


def _model_file(tmp_path, model: ModelSpec) -> str:
    d = {k: getattr(model, k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "mlp", "tied_embeddings",
                                        "bias", "norm")}
    d["name"] = model.name
    if model.moe is not None:
        d["moe"] = {"experts": model.moe.experts, "top_k": model.moe.top_k, "expert_ffn_hidden": model.moe.expert_ffn_hidden,
                    "dense_layers": model.moe.dense_layers}
    p = tmp_path / f"{model.name}.json"
    p.write_text(json.dumps(d))
    return str(p), d


def _cli(tmp_path, engine, model, cluster, job, par, lps):
    path, _ = _model_file(tmp_path, model)
    argv = ["estimate", "--model", path, "--gpu", cluster.gpu.id, "--gpus", str(cluster.num_gpus), "-s", str(job.seq_len),
            "-b", str(job.global_batch_size), "--precision", job.precision, "--engine", engine, "--json"]
    for f, flag in CLI_FLAGS.items():
        argv += [flag, str(getattr(par, f))]
    if par.sequence_parallel is not None:
        argv.append("--sequence-parallel" if par.sequence_parallel else "--no-sequence-parallel")
    if par.attention is not None:
        argv += ["--attention", par.attention]
    if par.schedule is not None:
        argv += ["--schedule", par.schedule]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(argv)
    doc = json.loads(buf.getvalue())
    assert code in (0, 1), doc
    return doc["predicted"]


def _validate(tmp_path, engine, model, cluster, job, par, lps):
    _, mdict = _model_file(tmp_path, model)
    block = {f: getattr(par, f) for f in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "recompute", "sequence_parallel", "zero")}
    block["layers_per_stage"] = list(lps)
    if par.schedule is not None:
        block["schedule"] = par.schedule
    if par.attention is not None:
        block["attention"] = par.attention
    run = run_from_dict({"id": "r", "model": mdict, "job": {"seq_len": job.seq_len, "global_batch_size": job.global_batch_size,
                                                            "precision": job.precision},
                         "hardware": {"gpu": cluster.gpu.id, "num_gpus": cluster.num_gpus}, "parallel": block})
    # The engine-decided fields a runs file cannot hold stay as the case left them (given or None).
    results, refused = validate_runs([run], SearchOptions(engine=engine), median=False)
    assert not refused, refused
    return results[0].estimate


def _plan(engine, model, cluster, job, par, lps):
    # every field fixed, the schedule too (the search would otherwise also try the engine's others)
    fixed = {k: v for k, v in par.as_dict().items() if v is not None and k != "layers_per_stage"}
    fixed.setdefault("schedule", planner.resolve(par.replace(layers_per_stage=tuple(lps)), model, cluster, job,
                                                 planner.get_engine(engine))[0].schedule)
    fixed["layers_per_stage"] = tuple(lps)
    opts = SearchOptions(fixed=fixed, engine=engine, uneven_split=False, allow_tp_across_nodes=True, max_vpp=max(4, par.vpp),
                         max_micro_batch=max(4, par.micro_batch_size))
    result = planner.plan(model, cluster, job, top_k=1, options=opts)
    return result.plans[0].estimate


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b))


def test_the_cases_cover_engines_moe_and_partly_fixed_fields():
    assert len(CASES) >= 200
    assert {c[0] for c in CASES} == set(ENGINE_NAMES)
    assert sum(c[1].moe is not None for c in CASES) >= 40
    assert sum(any(getattr(c[4], f) is None for f in ENGINE_ONLY) for c in CASES) >= 100
    assert sum(all(getattr(c[4], f) is not None for f in ENGINE_ONLY) for c in CASES) >= 1
    assert sum(c[4].pp > 1 for c in CASES) >= 50 and sum(c[4].zero >= 2 for c in CASES) >= 20
    assert sum(c[4].attention == "fa2" for c in CASES) >= 10


@pytest.mark.parametrize("chunk", range(11))
def test_every_door_gives_the_same_step_and_memory(chunk, tmp_path):
    for engine, model, cluster, job, par in CASES[chunk * 20:(chunk + 1) * 20]:
        a = _api(engine, model, cluster, job, par)
        where = f"{engine} {model.name} {cluster.num_gpus}x{cluster.gpu.id} {job} {par!r}"
        lps = a.layers_per_stage
        cli = _cli(tmp_path, engine, model, cluster, job, par, lps)
        val = _validate(tmp_path, engine, model, cluster, job, par, lps)
        entry = _plan(engine, model, cluster, job, par, lps) if a.fits else None
        for name, step, mem in (("cli", cli["step_time_s"], cli["memory_peak_bytes"]),
                                ("validate", val.step_time_s, val.memory_peak_bytes),
                                *((("plan", entry.step_time_s, entry.memory_peak_bytes),) if entry else ())):
            assert _close(step, a.step_time_s), f"{name} step {step} vs API {a.step_time_s}: {where}"
            assert _close(mem, a.memory_peak_bytes), f"{name} memory {mem} vs API {a.memory_peak_bytes}: {where}"
        assert get_engine(engine).name == a.engine
