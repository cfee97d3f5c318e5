"""The terminal experience, driven as a user would: the default example through a pipe, a
Hugging Face config.json, a YAML model, unknown names, presets, pictures, explanations, and
every JSON output validated against the JSON Schema the package ships."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import planner.cli  # noqa: F401  (registers the commands)
from planner import __version__
from planner.cli.app import main
from planner.io.presets import read_preset

REPO = Path(__file__).resolve().parents[2]
HF_8B = REPO / "tests" / "fixtures" / "hf" / "llama-3.1-8b.json"
SMALL = ["--model", "llama3.1-8b", "--gpus", "16", "-b", "32"]


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def piped(*args: str) -> subprocess.CompletedProcess:
    """``python -m planner ARGS`` with stdout/stderr pipes and no width or colour hints."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def assert_plain_80(text: str) -> None:
    assert "\x1b" not in text, "ANSI escape in piped output"
    assert "…" not in text, "a value was truncated"
    for line in text.splitlines():
        assert len(line) <= 80, f"{len(line)} columns: {line!r}"


def table_rows(out: str) -> list[list[str]]:
    """Rows of the plans table: lines that start with a rank."""
    return [line.split() for line in out.splitlines() if line.strip() and line.split()[0].isdigit() and "/" in line]


def test_default_example_through_a_pipe():
    p = piped("plan")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # no progress bar or colour when stderr is not a terminal
    out = p.stdout
    assert_plain_80(out)
    lines = out.splitlines()
    assert lines[0].startswith("Llama 3.1 70B on 64 x h100-sxm5-80gb (8 nodes), seq 8192, batch 256")
    header = lines[1].split()
    assert header == ["#", "tp/pp/dp/cp", "mb", "x", "n", "v", "rec", "Z", "step", "tok/s", "MFU", "GiB", "bound"]
    rows = table_rows(out)
    assert [int(r[0]) for r in rows] == list(range(1, 11))
    for r in rows:
        tp, pp, dp, cp = map(int, r[1].split("/"))
        assert tp * pp * dp * cp == 64
        mb, n = map(int, r[2].split("x"))
        assert mb * n * dp == 256
        assert int(r[3]) >= 1 and r[4] in ("-", "sel", "full") and r[5] in "0123"
        assert r[7] in ("s", "ms") and float(r[6]) > 0  # "29.23 s"
        assert r[8][-1] in "kM" and float(r[8][:-1]) > 0
        assert r[9].endswith("%") and 0 < float(r[9][:-1]) < 100
        assert 0 < float(r[10]) <= 79.6  # the H100 preset: 81559 MiB as nvidia-smi reports it
        # bound: the largest exposed term and its share of the step ("compute 93%", "dp ib 9%")
        assert r[11] in ("compute", "bubble", "tp", "pp", "dp", "cp", "ep", "optimizer", "overhead")
        assert r[-1].endswith("%") and 0 < int(r[-1][:-1]) <= 100
    assert "capacity 79.6 GiB" in out and "memory in GiB (2^30 bytes)" in out
    reason = next(i for i, line in enumerate(lines) if line.startswith("recommended: #1 "))
    assert " #2 " in lines[reason] and "GiB" in " ".join(lines[reason:reason + 4])
    assert "candidates" in out.split("recommended:")[1] and "solver none" not in out


def test_counts_take_a_plural_only_when_not_one(capsys):
    code, out, err = run(capsys, "plan", "--model", "llama3.1-8b", "--gpus", "8", "-b", "32", "--top", "2")
    assert code == 0, err
    assert "(1 node)" in out and "(1 nodes)" not in out


def test_plan_explain_prints_the_three_parts(capsys):
    code, out, err = run(capsys, "plan", *SMALL, "--top", "3", "--explain")
    assert code == 0, err
    for heading in ("Where the step time goes", "Memory per GPU by pipeline stage", "Nearest changes, best first"):
        assert heading in out
    assert "compute (fwd + bwd)" in out and "total" in out
    changes = [line for line in out.splitlines() if line.strip()[:3] in ("1. ", "2. ", "3. ")]
    assert len(changes) == 3 and all("step " in c and "fit" in c for c in changes)


def test_explain_command_on_a_plan_file(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", *SMALL, "--top", "3", "--json")
    assert code == 0
    path = tmp_path / "plan.json"
    path.write_text(out)
    code, out, err = run(capsys, "explain", str(path), "--rank", "2")
    assert code == 0, err
    assert "plan 2: tp=" in out and "note: re-predicted" not in out
    code, _, err = run(capsys, "explain", str(path), "--rank", "9")
    assert code == 2 and err.count("\n") == 1 and "--rank" in err


def test_hf_config_json_model(capsys):
    code, out, err = run(capsys, "plan", "--model", str(HF_8B), "--gpus", "8", "-b", "32", "--top", "3")
    assert code == 0, err
    assert len(table_rows(out)) == 3
    code, out, err = run(capsys, "models", "show", str(HF_8B))
    assert code == 0, err
    assert "8.03 B" in out and "4096" in out and "swiglu" in out


def test_yaml_model_file(capsys, tmp_path):
    spec = {"name": "Tiny GPT", "layers": 12, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "vocab": 50304, "mlp": "gelu"}
    path = tmp_path / "tiny.yaml"
    path.write_text("\n".join(f"{k}: {v}" for k, v in spec.items()) + "\n")
    code, out, err = run(capsys, "plan", "--model", str(path), "--gpus", "8", "-s", "2048", "-b", "64", "--top", "2")
    assert code == 0, err
    assert out.startswith("Tiny GPT on 8 x h100-sxm5-80gb")
    code, out, err = run(capsys, "models", "show", str(path))
    assert code == 0 and "Tiny GPT" in out


@pytest.mark.parametrize("args, field, hint", [
    (["plan", "--model", "lama3.1-70b"], "--model", "llama3.1-70b"),
    (["plan", "--gpu", "h100-sxm"], "--gpu", "h100-sxm5-80gb"),
    (["plan", "--cluster", "dgx-h100-superpd"], "--cluster", "dgx-h100-superpod"),
    (["hw", "show", "h100-sxm5"], "hw", "h100-sxm5-80gb"),
    (["models", "show", "mixtral-8x7"], "--model", "mixtral-8x7b"),
    (["schema", "plna"], "NAME", "plan"),
])
def test_unknown_name_one_line_exit_2_with_suggestion(capsys, args, field, hint):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"error: {field}: ")
    assert "did you mean" in err and hint in err


def test_unknown_name_through_a_pipe():
    p = piped("plan", "--model", "lama3.1-70b")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "did you mean llama3.1-70b" in p.stderr


def test_presets_lists_fit_80_columns():
    p = piped("models", "list")
    assert p.returncode == 0, p.stderr
    assert_plain_80(p.stdout)
    assert "llama3.1-70b" in p.stdout and "deepseek-v3" in p.stdout
    p = piped("hw", "list")
    assert p.returncode == 0, p.stderr
    assert_plain_80(p.stdout)
    for heading in ("GPUs", "Fabrics", "Clusters"):
        assert heading in p.stdout
    assert "h100-sxm5-80gb" in p.stdout and "ndr-ib" in p.stdout and "dgx-h100-superpod" in p.stdout


def test_hw_show_and_models_show(capsys):
    code, out, _ = run(capsys, "hw", "show", "h100-sxm5-80gb")
    assert code == 0 and "memory_gib" in out and "79.6" in out
    code, out, _ = run(capsys, "hw", "show", "ndr-ib")
    assert code == 0 and "gbps_per_nic" in out
    code, out, _ = run(capsys, "models", "show", "llama3.1-70b")
    assert code == 0 and "70.55 B" in out


def test_version_and_help_examples(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out == f"planner {__version__}\n"
    for cmd in (["plan"], ["estimate"], ["validate"], ["explain"], ["timeline"], ["chart", "memory"], ["chart", "scaling"],
                ["models", "list"], ["models", "show"], ["hw", "list"], ["hw", "show"], ["schema"]):
        code, out, _ = run(capsys, *cmd, "--help")
        assert code == 0 and "Example" in out, cmd
    code, out, _ = run(capsys, "--help")
    assert "--install-completion" in out


def _validator(name: str):
    jsonschema = pytest.importorskip("jsonschema")
    from planner.cli.schema import schema_text

    schema = json.loads(schema_text(name))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _runs_file(tmp_path: Path) -> Path:
    model = read_preset("models", "llama3.1-8b")
    runs = {"schema": "planner-runs/1", "runs": [
        {"id": "a", "model": model, "job": {"seq_len": 8192, "global_batch_size": 32, "precision": "bf16"},
         "hardware": {"gpu": "h100-sxm5-80gb", "num_gpus": 16}, "parallel": {"tp": 2, "pp": None},
         "measured": {"step_time_s": 3.0}},
        {"id": "b", "model": model, "job": {"seq_len": 4096, "global_batch_size": 64, "precision": "bf16"},
         "hardware": {"gpu": "a100-sxm4-80gb", "num_gpus": 8}, "parallel": {}, "measured": {"step_time_s": 20.0}},
    ]}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    return path


def test_validate_breaks_long_run_ids_after_hyphens_in_80_columns(tmp_path):
    """Piped, the validate table keeps 80 columns: a run id too long for its column goes onto a
    second line after a hyphen (never cut, never split inside a word); the summary lines fold."""
    model = read_preset("models", "llama3.1-8b")
    long_id = "mb2606-llama31_8b-bf16-tokendrop-16h100-alternative-recipe"
    runs = {"schema": "planner-runs/1", "runs": [
        {"id": long_id, "model": model, "job": {"seq_len": 8192, "global_batch_size": 32, "precision": "bf16"},
         "hardware": {"gpu": "h100-sxm5-80gb", "num_gpus": 16}, "parallel": {"tp": 2}, "measured": {"step_time_s": 3.0}}]}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    res = piped("validate", str(path))
    assert res.returncode == 0, res.stderr
    assert_plain_80(res.stdout)
    lines = res.stdout.splitlines()
    body = lines[[i for i, line in enumerate(lines) if line.startswith("─")][0] + 1:]
    id_lines = [line.split()[0] for line in body[:4] if line.strip() and line.split()[0] in long_id]
    assert "".join(id_lines) == long_id and len(id_lines) > 1
    assert all(part.endswith("-") for part in id_lines[:-1])


def test_gpus_beyond_a_cluster_preset_are_noted(capsys):
    """A cluster preset grown past its own size is priced, with a note saying so (text and JSON)."""
    grown = ["--model", "llama3.1-8b", "--cluster", "dgx-h100-superpod", "-b", "512"]
    code, out, err = run(capsys, "plan", *grown, "--gpus", "2048", "--top", "1")
    assert code == 0, err
    assert "--gpus 2048 is more than the 1016 GPUs of DGX SuperPOD" in " ".join(out.split())
    code, out, err = run(capsys, "estimate", *grown, "--gpus", "2048", "--tp", "4")
    assert code == 0, err
    assert "is more than the 1016 GPUs" in out
    code, out, err = run(capsys, "plan", *grown, "--gpus", "2048", "--top", "1", "--json")
    doc = json.loads(out)
    _validator("plan").validate(doc)
    assert doc["notes"] == ["--gpus 2048 is more than the 1016 GPUs of DGX SuperPOD (DGX H100, NDR InfiniBand); "
                            "priced as if its fabric grew to that size (same links, tiers and oversubscription)"]
    code, out, err = run(capsys, "plan", *grown, "--gpus", "256", "--top", "1", "--json")
    assert code == 0 and "notes" not in json.loads(out)
    code, out, err = run(capsys, "plan", *grown, "--gpus", "256", "--top", "1")
    assert code == 0 and "more than the" not in out


def test_a_cluster_file_without_a_size_takes_gpus_and_a_gpu_files_errors_keep_their_field(capsys, tmp_path):
    """A cluster file need not state num_gpus (--gpus sizes it, with no note); an error inside a
    GPU file the cluster names is reported against the GPU file's own field."""
    c = tmp_path / "c.yaml"
    c.write_text("name: x\ngpu: h100-sxm5-80gb\ngpus_per_node: 8\n")
    code, out, err = run(capsys, "estimate", "--model", "llama3.1-8b", "--cluster", str(c), "--gpus", "16", "--tp", "2", "-b", "32")
    assert code == 0, err
    assert "step time" in out and "more than the" not in out
    g = tmp_path / "mygpu.yaml"
    g.write_text("id: mygpu\nname: my\nmemory_gib: -5\nhbm_bandwidth_gbs: 3000\npeak_tflops: {bf16: 900}\nsm_count: 132\n")
    c.write_text(f"gpu: {g}\nnum_gpus: 16\n")
    code, _, err = run(capsys, "plan", "--model", "llama3.1-8b", "--cluster", str(c))
    assert code == 2 and f"{g}.memory_gib: got -5" in err, err


def test_json_outputs_match_the_shipped_schemas(capsys, tmp_path):
    code, out, err = run(capsys, "plan", *SMALL, "--top", "3", "--explain", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "planner-plan/1"
    _validator("plan").validate(doc)
    code, out, err = run(capsys, "estimate", *SMALL, "--tp", "2", "--pp", "2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "planner-estimate/1"
    _validator("estimate").validate(doc)
    # every attention kernel the planner prices is one the schemas allow
    from planner.specs import ATTENTION_KINDS  # noqa: PLC0415

    for name in ("plan", "estimate"):
        from planner.cli.schema import schema_text  # noqa: PLC0415

        assert set(json.loads(schema_text(name))["$defs"]["parallel"]["properties"]["attention"]["enum"]) == set(ATTENTION_KINDS), name
    # every cross-entropy kind a job can name is one the schemas allow (plan, estimate, check)
    from planner.specs import CROSS_ENTROPY  # noqa: PLC0415

    for name, where in (("plan", ("$defs", "job")), ("estimate", ("$defs", "job")), ("check", ("properties", "job"))):
        node = json.loads(schema_text(name))
        for key in where:
            node = node[key]
        assert set(node["properties"]["cross_entropy"]["enum"]) == set(CROSS_ENTROPY), name
    code, out, err = run(capsys, "estimate", *SMALL, "--engine", "torchtitan", "--cross-entropy", "compiled", "--json")
    assert code == 0, err
    _validator("estimate").validate(json.loads(out))
    code, out, err = run(capsys, "estimate", *SMALL, "--tp", "2", "--attention", "fa2", "--json")
    assert code == 0, err
    _validator("estimate").validate(json.loads(out))
    code, out, err = run(capsys, "validate", str(_runs_file(tmp_path)), "--json")
    assert code == 0, err
    assert err == ""  # no progress bar without a terminal
    doc = json.loads(out)
    assert doc["schema"] == "planner-validate/1" and len(doc["runs"]) == 2
    _validator("validate").validate(doc)
    code, out, _ = run(capsys, "schema", "estimate")
    assert code == 0 and json.loads(out)["title"] == "planner-estimate/1"


def test_pictures(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", *SMALL, "--pp", "4", "--vpp", "2", "--top", "2", "--json")
    assert code == 0
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    svg, png = tmp_path / "t.svg", tmp_path / "t.png"
    code, out, err = run(capsys, "timeline", str(plan), "--out", str(svg))
    assert code == 0, err
    assert svg.read_text().startswith("<svg") and "interleaved pp=4 vpp=2" in out
    code, _, err = run(capsys, "timeline", str(plan), "--out", str(svg))
    assert code == 2 and "--force" in err and err.count("\n") == 1
    code, _, err = run(capsys, "timeline", str(plan), "--out", str(svg), "--force", "--rank", "2")
    assert code == 0, err
    code, _, err = run(capsys, "timeline", str(plan), "--out", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, err = run(capsys, "timeline", str(plan), "--out", str(tmp_path / "t.pdf"))
    assert code == 2 and ".svg or .png" in err
    mem = tmp_path / "m.svg"
    code, out, err = run(capsys, "chart", "memory", str(plan), "--out", str(mem))
    assert code == 0 and mem.read_text().lstrip().startswith("<?xml"), err
    scaling = tmp_path / "s.png"
    code, out, err = run(capsys, "chart", "scaling", "--model", "llama3.1-8b", "--gpus", "8,16", "-b", "32", "--out", str(scaling))
    assert code == 0, err
    assert scaling.read_bytes()[:4] == b"\x89PNG" and "GPUs" in out
    code, _, err = run(capsys, "chart", "scaling", "--gpus", "8,x", "--out", str(tmp_path / "x.svg"))
    assert code == 2 and "--gpus" in err


def test_timeline_rejects_another_document(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "planner-validate/1"}))
    code, _, err = run(capsys, "timeline", str(bad), "--out", str(tmp_path / "t.svg"))
    assert code == 2 and err.count("\n") == 1 and "planner-plan/1" in err


def test_engine_flag_changes_the_engine_features_and_rejects_unknown_names():
    from planner.cli.app import main

    base = ["plan", "--model", "gpt3-1.3b", "--gpu", "a100-sxm4-80gb", "--gpus", "8", "-s", "2048", "-b", "64",
            "--precision", "fp16", "--top", "1", "--json"]
    import contextlib
    import io
    import json as _json

    def run(extra):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(base + extra)
        return code, buf.getvalue()

    code_l, out_l = run(["--engine", "megatron-legacy"])
    code_m, out_m = run([])
    assert code_l == 0 and code_m == 0
    legacy, modern = _json.loads(out_l), _json.loads(out_m)
    assert legacy["engine"] == "megatron-legacy" and modern["engine"] == "megatron-core"
    lp = legacy["plans"][0]
    assert lp["parallel"]["cp"] == 1 and lp["parallel"]["recompute"] != "selective" and lp["parallel"]["attention"] == "unfused"
    assert modern["plans"][0]["predicted"]["step_time_s"] <= lp["predicted"]["step_time_s"]
    assert main(base + ["--engine", "old"]) == 2


def test_every_command_help_has_an_example():
    from planner.cli.app import main
    import contextlib
    import io

    commands = ["plan", "estimate", "validate", "explain", "launch", "timeline", "chart", "collective", "ps",
                "schema", "models", "hw", "goodput", "sweep", "calibrate", "hetero"]
    for cmd in commands:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main([cmd, "--help"])
        assert code == 0, cmd
        assert "example" in buf.getvalue().lower(), cmd


def test_nothing_fits_with_json_writes_an_error_document():
    import contextlib
    import io
    import json as _json

    from planner.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", "--model", "llama3.1-405b", "--gpus", "8", "--json"])
    assert code == 1
    doc = _json.loads(out.getvalue())
    assert doc["schema"] == "planner-error/1" and doc["exit_code"] == 1 and "GiB per GPU" in doc["error"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", "--tp", "3", "--json"])  # bad input: exit 2, the same kind of document
    doc = _json.loads(out.getvalue())
    assert code == 2 and doc["schema"] == "planner-error/1" and doc["exit_code"] == 2 and doc["field"] and doc["expected"]
    assert err.getvalue().startswith("error: ")


def test_hf_config_takes_its_name_from_the_file_or_folder(tmp_path):
    import json as _json
    from pathlib import Path

    from planner.io.loaders import load_model

    src = next((Path(__file__).parents[1] / "fixtures" / "hf").glob("*.json"))
    data = _json.loads(src.read_text())
    data.pop("_name_or_path", None)
    named = tmp_path / "my-model.json"
    named.write_text(_json.dumps(data))
    folder = tmp_path / "Some-Repo"
    folder.mkdir()
    (folder / "config.json").write_text(_json.dumps(data))
    assert load_model(str(named)).name == "my-model"
    assert load_model(str(folder / "config.json")).name == "Some-Repo"
    data["_name_or_path"] = "org/recorded-name"
    named.write_text(_json.dumps(data))
    assert load_model(str(named)).name == "org/recorded-name"


@pytest.mark.parametrize("args, hint", [
    (["plan", "--tensor-parallel", "8"], "did you mean --tp?"),
    (["plan", "--pipeline-parallel", "2"], "did you mean --pp?"),
    (["estimate", "--tensor-model-parallel-size", "2"], "did you mean --tp?"),
    (["plan", "--micro-batch", "2"], "did you mean --micro-batch-size?"),
    (["plan", "--zero-stage", "1"], "did you mean --zero?"),
])
def test_unknown_flags_suggest_the_closest_meaning(capsys, args, hint):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and hint in err and "sequence-parallel" not in err


def test_gpu_ids_match_by_family_before_spelling(capsys):
    code, _, err = run(capsys, "plan", "--gpu", "h100")
    assert code == 2 and err.count("\n") == 1
    hint = err.split("did you mean ")[1]
    assert "h100-sxm5-80gb" in hint and "gb200" not in hint
    from planner.errors import suggest

    assert suggest("a100", ["a100-sxm4-80gb", "a100-pcie-80gb", "h100-sxm5-80gb", "gb200"]).count("a100") == 2
    assert "gb200" not in suggest("h100", ["h100-sxm5-80gb", "gb200", "b200-sxm-180gb"])


def test_a_crash_is_one_line_exit_4_and_debug_shows_the_traceback(capsys, monkeypatch):
    import planner.cli.plan as plan_mod

    def boom(*a, **k):
        raise ZeroDivisionError("synthetic bug")

    monkeypatch.setattr(plan_mod, "setup_from_cli", boom)
    code, out, err = run(capsys, "plan")
    assert code == 4 and out == ""
    assert err.count("\n") == 1 and "internal error: ZeroDivisionError: synthetic bug" in err and "--debug" in err
    with pytest.raises(ZeroDivisionError):
        main(["plan", "--debug"])


def test_readme_lists_every_exit_code():
    readme = (REPO / "README.md").read_text()
    table = readme.split("### Exit codes", 1)[1].split("\n\n", 2)[1]
    for code in ("0", "1", "2", "3", "4"):
        assert f"| {code} |" in table, code


def test_terminal_pictures_script_records_the_plan(tmp_path, monkeypatch):
    """docs/terminal_pictures.py regenerates README's terminal pictures (rich Console(record=True) -> SVG)."""
    import importlib.util
    import xml.etree.ElementTree as ET

    spec = importlib.util.spec_from_file_location("terminal_pictures", REPO / "docs" / "terminal_pictures.py")
    tp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tp)
    assert {"plan", "plan-explain", "check"} <= set(tp.PICTURES)  # check: the hook for `planner check`
    monkeypatch.setattr(tp, "OUT", tmp_path)
    monkeypatch.setitem(tp.PICTURES, "small", (["plan", *SMALL, "--top", "2"], "planner plan (small)"))
    path = tp.picture("small")
    assert tp.picture("check") is None or tp.PICTURES["check"][0] is not None
    svg = path.read_text()
    ET.fromstring(svg)
    assert "recommended:" in svg.replace("&#160;", " ") and "https://cdnjs" not in svg
    for name in ("plan", "plan-explain"):
        assert (REPO / "docs" / "img" / f"{name}.svg").exists(), name


def test_a_refusal_of_a_scenario_run_names_the_run(capsys):
    """A value read from a runs file that the engine refuses says which run it came from; the
    next command in the same process does not inherit the name."""
    rid = "mb2511-qwen3_30b_a3b-fp8mx-8b200"
    code, _, err = run(capsys, "estimate", "--scenario", "modern", "--id", rid, "--engine", "torchtitan")
    assert code == 2 and err.count("\n") == 1
    assert "job.fp8_recipe" in err and f"(run {rid} of modern)" in err
    code, _, err = run(capsys, "estimate", *SMALL, "--tp", "3")
    assert code == 2 and "(run " not in err


def test_estimate_reprices_a_plan_with_its_split(capsys):
    """A plan's uneven pipeline split and expert-TP degree are estimate flags, so `planner estimate`
    with the plan's fields gives the plan's own step time (as planner.estimate does)."""
    import planner  # noqa: PLC0415

    m, c, j = planner.load_model("llama3.1-70b"), planner.make_cluster("h100-sxm5-80gb", 64), planner.Job(8192, 256)
    par = planner.ParallelConfig(tp=8, pp=4, dp=2, micro_batch_size=1, recompute="full", layers_per_stage=(19, 21, 21, 19))
    want = planner.estimate(m, c, j, par).step_time_s
    code, out, err = run(capsys, "estimate", "--model", "llama3.1-70b", "--gpus", "64", "-s", "8192", "-b", "256", "--tp", "8",
                         "--pp", "4", "--mb", "1", "--recompute", "full", "--layers-per-stage", "19,21,21,19", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["parallel"]["layers_per_stage"] == [19, 21, 21, 19] and d["predicted"]["step_time_s"] == want
    code, out, err = run(capsys, "estimate", *SMALL, "--pp", "2", "--layers-per-stage", "16,x")
    assert code == 2 and "--layers-per-stage" in err


def test_a_closed_stdout_exits_141_not_the_nothing_fits_code():
    """`planner ... | head` closes stdout early: exit 141 (128 + SIGPIPE), silent, never 1."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    for argv in (["estimate", "--model", "gpt3-1.3b", "--gpus", "8"], ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--json"]):
        p = subprocess.Popen([sys.executable, "-m", "planner", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.close()  # before the command prints (it takes ~1 s to start)
        err = p.stderr.read().decode()
        assert p.wait(timeout=120) == 141, (argv, err)
        assert "internal error" not in err and "Traceback" not in err


@pytest.mark.parametrize("argv,flag,value,expected", [
    (["plan", "--gpus", "abc"], "--gpus", "abc", "an integer"),
    (["plan", "-n", "1.5"], "--gpus", "1.5", "an integer"),
    (["estimate", "--tp=x"], "--tp", "x", "an integer"),
    (["plan", "--nic-gbps", "fast"], "--nic-gbps", "fast", "a number"),
])
def test_a_value_of_the_wrong_type_gets_the_got_expected_line(argv, flag, value, expected):
    """A value typer cannot convert is an input error like any other: one line naming the flag,
    the value and what was expected, exit 2, and with --json the planner-error/1 fields."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, "--json"])
    assert code == 2
    assert err.getvalue() == f"error: {flag}: got {value!r}, expected {expected}\n"
    doc = json.loads(out.getvalue())
    assert (doc["field"], doc["value"], doc["expected"]) == (flag, value, expected)


def test_validate_table_shows_long_run_ids_whole_in_80_columns(tmp_path):
    """A run id longer than the table's run column is folded onto the next line, not cut with an
    ellipsis (an id is what a user searches the runs file for)."""
    path = _runs_file(tmp_path)
    doc = json.loads(path.read_text())
    long_id = "a-run-id-much-longer-than-the-run-column-of-an-eighty-column-table"
    doc["runs"][0]["id"] = long_id
    path.write_text(json.dumps(doc))
    p = piped("validate", str(path), "--no-median")
    assert p.returncode == 0, p.stderr
    assert "…" not in p.stdout
    assert long_id in "".join(ln.split(" ")[0] for ln in p.stdout.splitlines())


def test_an_output_path_that_cannot_be_written_is_bad_input_not_a_bug(capsys, tmp_path):
    """--out under a file, or in a folder the process cannot create, is exit 2 with one line
    naming the flag (it used to be exit 4, an internal error with NotADirectoryError)."""
    code, out, err = run(capsys, "plan", *SMALL, "--top", "1", "--json")
    assert code == 0, err
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    cases = [
        (["launch", str(plan), "--engine", "all", "--out", str(blocked / "sub")], "--out"),
        (["plan", *SMALL, "--emit", "megatron", "--out", str(blocked / "d")], "--out"),
        (["timeline", str(plan), "--out", str(tmp_path / "no-such-folder" / "t.svg")], "--out"),
        (["chart", "memory", str(plan), "--out", str(blocked / "m.svg")], "--out"),
    ]
    for argv, flag in cases:
        code, _, err = run(capsys, *argv)
        assert code == 2, (argv, err)
        assert err.startswith(f"error: {flag}: got ") and err.count("\n") == 1, (argv, err)
    assert not list(tmp_path.glob("**/.*.tmp"))  # nothing half-written left behind


def test_a_wrong_type_reads_the_same_from_click_without_pydantic():
    """Older typer leaves conversion to click (no pydantic ValidationError behind the error): the
    parameter's type names the kind and the value is read back from the command line."""
    from planner.cli.app import _bad_value

    class _Type:
        name = "integer"

    class _Param:
        opts, secondary_opts, type = ["--gpus", "-n"], [], _Type()

    BadParameter = type("BadParameter", (Exception,), {})
    exc = BadParameter("'abc' is not a valid integer.")
    exc.param = _Param()
    assert _bad_value(exc, ["plan", "-n", "abc"]) == ("--gpus", "abc", "an integer")
    assert _bad_value(exc, ["plan", "--gpus=7x"]) == ("--gpus", "7x", "an integer")


def test_an_unknown_option_of_a_subcommand_names_its_whole_command(capsys):
    code, _, err = run(capsys, "models", "list", "--json")
    assert code == 2 and "(planner models list --help)" in err, err
