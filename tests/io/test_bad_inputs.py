"""Bad input at the CLI edge: exit code 2 and exactly one line on stderr naming the field.

Table-driven over flags, model / cluster / scenario / Hugging Face files, and parallel
configurations that break an engine rule. Runs in-process through ``planner.cli.app.main``
(which returns the exit code); two cases also go through a real subprocess to make sure no
traceback escapes and that ``--debug`` shows one.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import re
import sys

import pytest

from planner.cli.app import main

GOOD_MODEL = {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 8, "ffn_hidden": 1024, "vocab": 1000, "mlp": "gelu"}
GOOD_RUN = {
    "id": "r1",
    "model": dict(GOOD_MODEL),
    "job": {"seq_len": 1024, "global_batch_size": 32, "precision": "bf16"},
    "hardware": {"gpu": "a100-sxm4-80gb", "num_gpus": 8},
    "parallel": {"tp": 1, "pp": 1, "dp": 8, "cp": 1, "ep": 1, "vpp": None, "micro_batch_size": None,
                 "recompute": None, "sequence_parallel": None, "zero": None},
}


def _model(**kw):
    d = dict(GOOD_MODEL)
    for k, v in kw.items():
        if v is _DROP:
            d.pop(k)
        else:
            d[k] = v
    return d


def _run(section: str | None = None, **kw):
    r = json.loads(json.dumps(GOOD_RUN))
    target = r if section is None else r[section]
    target.update(kw)
    return {"schema": "planner-runs/1", "runs": [r]}


_DROP = object()
_CLUSTER = {"gpu": "h100-sxm5-80gb", "num_gpus": 16}

# (id, argv ({f} = the written file), file name, file content (dict -> JSON/YAML, str -> raw), field in the message)
CASES = [
    # --- flags: counts, sizes, units ---
    ("gpus-zero", ["plan", "--gpus", "0"], None, None, "--gpus"),
    ("gpus-negative", ["plan", "--gpus", "-8"], None, None, "--gpus"),
    ("gpus-absurd", ["plan", "--gpus", "20000000"], None, None, "--gpus"),
    ("gpus-not-node-multiple", ["plan", "--gpus", "12"], None, None, "hardware.num_gpus"),
    ("gpn-zero", ["plan", "--gpus-per-node", "0"], None, None, "--gpus-per-node"),
    ("gpn-not-dividing", ["plan", "--gpus-per-node", "3"], None, None, "hardware.num_gpus"),
    ("nic-nan", ["plan", "--nic-gbps", "nan"], None, None, "--nic-gbps"),
    ("nic-negative", ["plan", "--nic-gbps", "-5"], None, None, "--nic-gbps"),
    ("nic-zero", ["plan", "--nic-gbps", "0"], None, None, "--nic-gbps"),
    ("nic-inf", ["plan", "--nic-gbps", "inf"], None, None, "--nic-gbps"),
    ("nics-zero", ["plan", "--nics-per-node", "0"], None, None, "--nics-per-node"),
    ("network-unknown", ["plan", "--network", "carrier-pigeon"], None, None, "--network"),
    ("seq-zero", ["plan", "--seq-len", "0"], None, None, "--seq-len"),
    ("seq-absurd", ["plan", "--seq-len", "99999999999"], None, None, "--seq-len"),
    ("gbs-zero", ["plan", "-b", "0"], None, None, "--global-batch-size"),
    ("precision", ["plan", "--precision", "fp4"], None, None, "job.precision"),
    ("grad reduce dtype", ["plan", "--grad-reduce", "fp8"], None, None, "job.grad_reduce"),
    ("bf16 gradients in an fp16 run", ["estimate", "--precision", "fp16", "--grad-reduce", "bf16"], None, None, "job.grad_reduce"),
    ("attention", ["plan", "--attention", "sparse"], None, None, "--attention"),
    ("model-preset", ["plan", "--model", "llama9-1t"], None, None, "--model"),
    ("gpu-preset", ["plan", "--gpu", "h1000"], None, None, "--gpu"),
    ("cluster-preset", ["plan", "--cluster", "nowhere"], None, None, "--cluster"),
    ("top-zero", ["plan", "--top", "0"], None, None, "--top"),
    ("time-limit-zero", ["plan", "--time-limit", "0"], None, None, "--time-limit"),
    ("time-limit-text", ["plan", "--time-limit", "soon"], None, None, "--time-limit"),
    ("tp-not-int", ["plan", "--tp", "abc"], None, None, "--tp"),
    ("unknown-flag", ["plan", "--bogus"], None, None, "--bogus"),
    # --- parallel configurations that break a rule ---
    ("tp-zero", ["plan", "--tp", "0"], None, None, "--tp"),
    ("pp-negative", ["estimate", "--pp", "-1"], None, None, "--pp"),
    ("tp-not-dividing-gpus", ["plan", "--tp", "3"], None, None, "parallel.tp"),
    ("tp-not-dividing-heads", ["plan", "--gpus", "48", "--tp", "3"], None, None, "parallel.tp"),
    ("tp-over-nvlink", ["plan", "--tp", "16"], None, None, "parallel.tp"),
    ("degrees-product", ["plan", "--tp", "8", "--pp", "4", "--dp", "4"], None, None, "parallel"),
    ("degrees-product-estimate", ["estimate", "--tp", "8", "--pp", "2", "--dp", "2", "--cp", "1"], None, None, "parallel"),
    ("cp-seq", ["plan", "-s", "100", "--cp", "4"], None, None, "parallel.cp"),
    ("recompute", ["plan", "--recompute", "sometimes"], None, None, "--recompute"),
    ("zero-5", ["plan", "--zero", "5"], None, None, "--zero"),
    ("zero3-with-pp", ["plan", "--zero", "3", "--pp", "2"], None, None, "parallel.zero"),
    ("ep-dense", ["plan", "--ep", "2"], None, None, "parallel.ep"),
    ("vpp-without-pp", ["plan", "--vpp", "2", "--pp", "1"], None, None, "parallel.vpp"),
    ("vpp-not-dividing-stage", ["plan", "--vpp", "3", "--pp", "8", "--engine", "megatron-legacy"], None, None, "parallel.vpp"),
    ("mb-not-dividing", ["plan", "--mb", "3"], None, None, "parallel.micro_batch_size"),
    ("dp-not-dividing-batch", ["plan", "--dp", "64", "-b", "32"], None, None, "parallel.dp"),
    ("sp-without-tp", ["plan", "--tp", "1", "--sequence-parallel"], None, None, "parallel.sequence_parallel"),
    ("batch-too-small-for-gpus", ["plan", "--gpus", "1000000"], None, None, "job.global_batch_size"),
    # --- model files ---
    ("model-missing-file", ["plan", "--model", "{f}"], None, None, "--model"),
    ("model-bad-yaml", ["plan", "--model", "{f}"], "m.yaml", "layers: [1, 2\nhidden: 3", "m.yaml"),
    ("model-bad-json", ["plan", "--model", "{f}"], "m.json", "{\"layers\": 4,", "m.json"),
    ("model-not-mapping", ["plan", "--model", "{f}"], "m.yaml", "- 1\n- 2\n", "m.yaml"),
    ("model-unknown-field", ["plan", "--model", "{f}"], "m.yaml", _model(dropout=0.1), ".dropout"),
    ("model-missing-layers", ["plan", "--model", "{f}"], "m.yaml", _model(layers=_DROP), ".layers"),
    ("model-layers-text", ["plan", "--model", "{f}"], "m.json", _model(layers="many"), ".layers"),
    ("model-layers-float", ["plan", "--model", "{f}"], "m.json", _model(layers=4.5), ".layers"),
    ("model-layers-absurd", ["plan", "--model", "{f}"], "m.json", _model(layers=10**9), ".layers"),
    ("model-hidden-zero", ["plan", "--model", "{f}"], "m.json", _model(hidden=0), ".hidden"),
    ("model-vocab-negative", ["plan", "--model", "{f}"], "m.json", _model(vocab=-3), ".vocab"),
    ("model-kv-zero", ["plan", "--model", "{f}"], "m.json", _model(kv_heads=0), ".kv_heads"),
    ("model-heads-not-dividing-hidden", ["plan", "--model", "{f}"], "m.json", _model(heads=7, kv_heads=7), "model.heads"),
    ("model-kv-not-dividing-heads", ["plan", "--model", "{f}"], "m.json", _model(kv_heads=3), "model.kv_heads"),
    ("model-mlp", ["plan", "--model", "{f}"], "m.json", _model(mlp="tanh"), ".mlp"),
    ("model-tied-text", ["plan", "--model", "{f}"], "m.json", _model(tied_embeddings="no"), ".tied_embeddings"),
    ("model-lora-text", ["plan", "--model", "{f}"], "m.json", _model(q_lora_rank="x"), ".q_lora_rank"),
    ("moe-topk", ["plan", "--model", "{f}"], "m.json", _model(moe={"experts": 4, "top_k": 8, "expert_ffn_hidden": 64}), "model.moe.top_k"),
    ("moe-unknown", ["plan", "--model", "{f}"], "m.json", _model(moe={"experts": 4, "top_k": 2, "expert_ffn_hidden": 64, "router": "x"}), ".moe.router"),
    ("moe-shared-text", ["plan", "--model", "{f}"], "m.json", _model(moe={"experts": 4, "top_k": 2, "expert_ffn_hidden": 64, "shared_experts": "x"}), ".moe.shared_experts"),
    ("hf-heads", ["plan", "--model", "{f}"], "config.json",
     {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 0,
      "intermediate_size": 512, "vocab_size": 1000}, "config.json.num_attention_heads"),
    # --- cluster files ---
    ("cluster-no-gpu", ["plan", "--cluster", "{f}"], "c.yaml", {"num_gpus": 16}, ".gpu"),
    ("cluster-unknown", ["plan", "--cluster", "{f}"], "c.yaml", dict(_CLUSTER, colour="blue"), ".colour"),
    ("cluster-nic-negative", ["plan", "--cluster", "{f}"], "c.yaml", dict(_CLUSTER, inter_node={"gbps_per_nic": -1}), "inter_node.gbps_per_nic"),
    ("cluster-nic-kind", ["plan", "--cluster", "{f}"], "c.yaml", dict(_CLUSTER, inter_node={"kind": "smoke", "gbps_per_nic": 100, "nics_per_node": 8}), "inter_node.kind"),
    ("cluster-efficiency", ["plan", "--cluster", "{f}"], "c.yaml", dict(_CLUSTER, intra_node={"efficiency": 2}), "intra_node.efficiency"),
    # a file's unknown GPU names the file's field, not a --gpu flag the user never passed
    ("cluster-gpu-unknown", ["plan", "--cluster", "{f}"], "c.yaml", dict(_CLUSTER, gpu="h100"), "c.yaml.gpu: got 'h100'"),
    ("hetero-group-key", ["hetero", "{f}"], "m.yaml", {"groups": [{"gpu": "a100-sxm4-80gb", "count": 64}, {"gpu": "h100-sxm5-80gb", "cnt": 32}]},
     "groups[1].cnt: got 'cnt', expected a known field name (did you mean count?)"),
    ("hetero-group-gpu", ["hetero", "{f}"], "m.yaml", {"groups": [{"gpu": "a100", "count": 64}]}, "groups[0].gpu: got 'a100'"),
    ("hetero-batch-zero", ["hetero", "{f}", "-b", "0"], "m.yaml", {"groups": [{"gpu": "h100-sxm5-80gb", "count": 8}]}, "--global-batch-size: got 0"),
    ("hetero-seq-zero", ["hetero", "{f}", "-s", "0"], "m.yaml", {"groups": [{"gpu": "h100-sxm5-80gb", "count": 8}]}, "--seq-len: got 0"),
    ("cluster-latency-text", ["plan", "--cluster", "{f}"], "c.yaml", dict(_CLUSTER, intra_node={"latency_us": "fast"}), "intra_node.latency_us"),
    ("cluster-gpus-not-multiple", ["plan", "--cluster", "{f}"], "c.yaml", dict(_CLUSTER, num_gpus=20), "hardware.num_gpus"),
    # --- scenario / runs files ---
    ("scenario-seq-zero", ["plan", "--scenario", "{f}"], "s.json", _run("job", seq_len=0), "job.seq_len"),
    ("scenario-job-unknown", ["plan", "--scenario", "{f}"], "s.json", _run("job", tokens=5), "job.tokens"),
    ("scenario-tp-text", ["plan", "--scenario", "{f}"], "s.json", _run("parallel", tp="8"), "parallel.tp"),
    ("scenario-tp-rule", ["estimate", "--scenario", "{f}"], "s.json", _run("parallel", tp=3, dp=None), "parallel.tp"),
    ("scenario-zero-9", ["plan", "--scenario", "{f}"], "s.json", _run("parallel", zero=9), "parallel.zero"),
    ("scenario-run-unknown", ["plan", "--scenario", "{f}"], "s.json", _run(None, cost=1), ".cost"),
    ("scenario-hardware-missing", ["plan", "--scenario", "{f}"], "s.json", _run("hardware", num_gpus=None), "hardware.num_gpus"),
    ("scenario-id", ["plan", "--scenario", "{f}", "--id", "r2"], "s.json", _run(), "--id"),
    ("validate-schema", ["validate", "{f}"], "s.json", {"schema": "runs/0", "runs": [GOOD_RUN]}, ".schema"),
    ("validate-top-unknown", ["validate", "{f}"], "s.json", {"schema": "planner-runs/1", "runs": [GOOD_RUN], "extra": 1}, ".extra"),
]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _write(tmp_path, name, content):
    path = tmp_path / (name or "missing.yaml")
    if content is None:
        return path
    if isinstance(content, str):
        path.write_text(content)
    elif path.suffix == ".json":
        path.write_text(json.dumps(content))
    else:
        import yaml

        path.write_text(yaml.safe_dump(content))
    return path


def test_table_is_large_enough():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exit_2_one_line(case, tmp_path):
    _, argv, name, content, field = case
    path = _write(tmp_path, name, content)
    argv = [a.replace("{f}", str(path)) for a in argv]
    code, _, err = run_cli(argv)
    lines = err.splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert field in lines[0], lines[0]
    assert "Traceback" not in err


def test_nothing_fits_is_exit_1_with_nearest_miss():
    code, _, err = run_cli(["plan", "--model", "llama3.1-405b", "--gpus", "8"])
    assert code == 1
    first = err.splitlines()[0]
    assert "needs" in first and "GiB per GPU" in first and "available" in first and "feasible with" in first


def _expire_after(monkeypatch, n_estimates: int) -> None:
    """Make the search's clock run out after ``n_estimates`` exact estimates (deterministic)."""
    import planner.search.plan as P

    calls = {"n": 0}
    real_estimate, real_clock = P.price, P.time.perf_counter

    def counting(*a, **kw):
        calls["n"] += 1
        return real_estimate(*a, **kw)

    class _Clock:
        @staticmethod
        def perf_counter():
            return real_clock() + (1e6 if calls["n"] >= n_estimates else 0.0)

    monkeypatch.setattr(P, "price", counting)
    monkeypatch.setattr(P, "time", _Clock)


def test_time_limit_is_exit_3_with_best_plan_so_far(monkeypatch):
    _expire_after(monkeypatch, 40)
    code, out, err = run_cli(["plan", "--model", "gpt3-1.3b", "--gpus", "64", "--time-limit", "5"])
    assert code == 3, err
    assert len(err.splitlines()) == 1
    # 40 pricings: a candidate is priced twice (time, then memory) once K plans exist
    hit = re.match(r"solver: time limit of 5 s hit after (\d+) of \d+ candidates evaluated", err)
    assert hit and 20 <= int(hit.group(1)) <= 40, err
    assert "best so far: step" in err
    assert out.splitlines()[0].startswith("1: tp=")


def test_time_limit_library_carries_partial_result(monkeypatch):
    import planner
    from planner.errors import SolverFailure

    _expire_after(monkeypatch, 5)
    model = planner.load_model("gpt3-1.3b")
    cluster = planner.make_cluster("a100-sxm4-80gb", 16)
    job = planner.Job(2048, 64)
    with pytest.raises(SolverFailure) as info:
        planner.plan(model, cluster, job, top_k=3, time_limit_s=1.0)
    best = info.value.best
    assert best is not None and 1 <= len(best.plans) <= 3 and best.evaluated == 5
    assert "not proven best" in best.notes[0]


def test_time_limit_default_is_30_s():
    from planner.search.plan import DEFAULT_TIME_LIMIT_S, TIME_LIMIT_S

    assert DEFAULT_TIME_LIMIT_S == 30.0 and TIME_LIMIT_S.get() == 30.0


def test_subprocess_no_traceback_and_debug_shows_one():
    cmd = [sys.executable, "-m", "planner", "plan", "--tp", "3"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "parallel.tp" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run(cmd + ["--debug"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "Traceback" in p.stderr


def test_scenario_job_may_name_the_gradient_dtype(tmp_path):
    import json  # noqa: PLC0415

    from planner.io.loaders import load_runs  # noqa: PLC0415

    model = {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "vocab": 32000}
    run = {"id": "r", "model": model, "hardware": {"gpu": "h100-sxm5-80gb", "num_gpus": 8},
           "job": {"seq_len": 4096, "global_batch_size": 32, "precision": "fp8", "grad_reduce": "bf16"}, "parallel": {}}
    f = tmp_path / "runs.json"
    f.write_text(json.dumps({"schema": "planner-runs/1", "runs": [run]}))
    assert load_runs(str(f))[0].job.grad_reduce == "bf16"


def test_time_limit_with_json_writes_an_error_document_with_the_plans_so_far(monkeypatch):
    """exit 3 under --json: a planner-error/1 document (exit_code 3) carrying the plans found
    before the limit, as exits 1 and 2 write theirs; stdout was empty before."""
    import json

    _expire_after(monkeypatch, 40)
    code, out, err = run_cli(["plan", "--model", "gpt3-1.3b", "--gpus", "64", "--time-limit", "5", "--json"])
    assert code == 3, err
    doc = json.loads(out)
    assert doc["schema"] == "planner-error/1" and doc["exit_code"] == 3 and "time limit" in doc["error"]
    assert doc["plans"] and doc["plans"][0]["rank"] == 1 and doc["plans"][0]["step_time_s"] > 0
    assert doc["plans"][0]["engine"] == "megatron-core"
    assert doc["plans"][0]["parallel"]["tp"] * doc["plans"][0]["parallel"]["pp"] * doc["plans"][0]["parallel"]["dp"] \
        * doc["plans"][0]["parallel"]["cp"] == 64


@pytest.mark.parametrize("key,hint", [("num_layers", "layers"), ("hidden_size", "hidden"), ("num_attention_heads", "heads"),
                                      ("layer", "layers")])
def test_unknown_model_key_names_itself_and_the_field_meant(tmp_path, key, hint):
    """A model YAML written with Hugging Face key names (or a typo) is told which key is unknown
    and which field it probably means."""
    fields = {"name": "m", "layers": 12, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "vocab": 32000}
    fields.pop(hint)
    fields[key] = 12 if hint == "layers" else (1024 if hint == "hidden" else 16)
    path = tmp_path / "m.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in fields.items()))
    code, out, err = run_cli(["estimate", "--model", str(path), "--gpus", "8"])
    assert code == 2 and len(err.splitlines()) == 1
    assert f"m.yaml.{key}: got {key!r}, expected a known field name (did you mean {hint}?)" in err, err


def test_a_sequence_beyond_the_models_positions_is_priced_with_a_note(tmp_path):
    """GPT-3 presets hold 2048 learned positions: a job at 8192 is priced as given, and plan and
    estimate say the model cannot run it as is; within the positions, no note. A Hugging Face
    config's max_position_embeddings is the same field."""
    import json

    import planner
    from planner.specs import positions_note

    m = planner.load_model("gpt3-1.3b")
    assert m.max_seq_len == 2048 and positions_note(m, 2048) is None
    assert "learned position embeddings" in positions_note(m, 8192)
    est = planner.estimate(m, planner.make_cluster("h100-sxm5-80gb", 8), planner.Job(8192, 64), planner.ParallelConfig(tp=1))
    assert any("longer than GPT-3 1.3B's 2048 positions" in n for n in est.notes)
    code, out, err = run_cli(["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--top", "1"])
    assert code == 0 and "2048 positions" in out
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 4096, "vocab_size": 32000,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hf = planner.load_model(str(tmp_path / "config.json"))
    assert hf.max_seq_len == 4096 and "rotary positions" in positions_note(hf, 8192)
