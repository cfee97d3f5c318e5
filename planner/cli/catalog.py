"""``planner models list|show`` and ``planner hw list|show``: the shipped presets."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from planner.cli.app import app
from planner.errors import InputError
from planner.report.tables import compact_table, console

__all__ = ["models_app", "hw_app"]

models_app = typer.Typer(help="Model presets: list them, or show one (a preset id, a YAML file or a Hugging Face config.json). "
                         "Examples: planner models list; planner models show llama3.1-70b; planner models show path/to/config.json",
                         no_args_is_help=True)
hw_app = typer.Typer(help="Hardware presets: GPUs, fabrics (inter-node networks) and clusters. "
                     "Examples: planner hw list; planner hw list clusters; planner hw show h100-sxm5-80gb", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(hw_app, name="hw")

_HW_KINDS = ("gpus", "fabrics", "clusters")


def _num(x, fmt: str = "{:g}") -> str:
    return "-" if x is None else fmt.format(x)


@models_app.command("list")
def models_list() -> None:
    """List the model presets: id, layers, hidden size, heads (query/KV), parameters.

    Example:
      planner models list
    """
    from planner.cost.flops import param_count  # noqa: PLC0415
    from planner.io.loaders import model_from_dict  # noqa: PLC0415
    from planner.io.presets import preset_ids, read_preset  # noqa: PLC0415

    t = compact_table()
    for col, just in (("id", "left"), ("layers", "right"), ("hidden", "right"), ("heads", "right"), ("ffn", "right"),
                      ("vocab", "right"), ("params", "right"), ("kind", "left")):
        t.add_column(col, justify=just, no_wrap=True)
    for mid in preset_ids("models"):
        m = model_from_dict(read_preset("models", mid), f"model[{mid}]")
        kind = f"MoE {m.moe.experts}x top{m.moe.top_k}" if m.moe else ("MLA" if m.is_mla else m.mlp)
        t.add_row(mid, str(m.layers), str(m.hidden), f"{m.heads}/{m.kv_heads}", str(m.ffn_hidden), str(m.vocab),
                  f"{param_count(m) / 1e9:.1f}B", kind)
    con = console()
    con.print(Text("Model presets (use the id with --model, or pass a YAML file or a config.json)", style="bold"))
    con.print(t)


@models_app.command("show")
def models_show(model: Annotated[str, typer.Argument(help="A preset id, a YAML model file or a Hugging Face config.json.")]) -> None:
    """Show one model: architecture, parameter count, source.

    Examples:
      planner models show llama3.1-70b
      planner models show path/to/config.json
    """
    from planner.cost.flops import param_count  # noqa: PLC0415
    from planner.io.loaders import load_model  # noqa: PLC0415

    m = load_model(model)
    t = compact_table(show_header=False)
    t.add_column("field", style="bold", no_wrap=True)
    t.add_column("value")
    rows = [("name", m.name), ("parameters", f"{param_count(m) / 1e9:.2f} B"), ("layers", m.layers), ("hidden", m.hidden),
            ("attention heads", m.heads), ("KV heads", m.kv_heads), ("head dim", m.head_dim), ("FFN hidden", m.ffn_hidden),
            ("vocabulary", m.vocab), ("MLP", m.mlp), ("norm", m.norm), ("biases", m.bias), ("tied embeddings", m.tied_embeddings)]
    if m.is_mla:
        rows += [("q / kv LoRA rank", f"{m.q_lora_rank} / {m.kv_lora_rank}"), ("rope / v head dim", f"{m.qk_rope_head_dim} / {m.v_head_dim}")]
    if m.moe:
        e = m.moe
        rows += [("experts", f"{e.experts} routed, top-{e.top_k}, {e.shared_experts} shared, FFN {e.expert_ffn_hidden}"),
                 ("dense layers", e.dense_layers)]
    if m.source:
        rows.append(("source", m.source))
    for k, v in rows:
        t.add_row(k, str(v))
    console().print(t)


def _gpu_table(ids) -> object:
    from planner.io.presets import read_preset  # noqa: PLC0415

    t = compact_table()
    for col, just in (("id", "left"), ("GiB", "right"), ("HBM GB/s", "right"), ("bf16 TF", "right"), ("fp8 TF", "right"),
                      ("NVLink GB/s", "right"), ("per node", "right")):
        t.add_column(col, justify=just, no_wrap=True)
    for gid in ids:
        d = read_preset("gpus", gid)
        peaks = d.get("peak_tflops") or {}
        t.add_row(gid, _num(d.get("memory_gib"), "{:.0f}"), _num(d.get("hbm_bandwidth_gbs"), "{:.0f}"), _num(peaks.get("bf16"), "{:.0f}"),
                  _num(peaks.get("fp8"), "{:.0f}"), _num(d.get("nvlink_gbs_per_direction") or None, "{:.0f}"), _num(d.get("gpus_per_node")))
    return t


def _fabric_table(ids) -> object:
    from planner.io.presets import read_preset  # noqa: PLC0415

    t = compact_table()
    for col, just in (("id", "left"), ("kind", "left"), ("Gb/s per NIC", "right"), ("latency us", "right"), ("efficiency", "right")):
        t.add_column(col, justify=just, no_wrap=True)
    for fid in ids:
        d = read_preset("fabrics", fid)
        t.add_row(fid, str(d.get("kind", "-")), _num(d.get("gbps_per_nic")), _num(d.get("latency_us")), _num(d.get("efficiency")))
    return t


def _cluster_table(ids) -> object:
    from planner.io.presets import read_preset  # noqa: PLC0415

    t = compact_table()
    for col, just in (("id", "left"), ("gpu", "left"), ("GPUs", "right"), ("/node", "right"), ("NICs per node", "left")):
        t.add_column(col, justify=just, no_wrap=True)
    for cid in ids:
        d = read_preset("clusters", cid)
        inter = d.get("inter_node") or {}
        kind = {"infiniband": "IB", "ethernet": "eth", "omnipath": "OPA", "roce": "RoCE"}.get(inter.get("kind"), inter.get("kind", ""))
        net = f"{inter.get('nics_per_node', '?')}x{_num(inter.get('gbps_per_nic'))}G {kind}".strip() if inter else "-"
        t.add_row(cid, str(d.get("gpu", "-")), _num(d.get("num_gpus")), _num(d.get("gpus_per_node")), net)
    return t


@hw_app.command("list")
def hw_list(
    kind: Annotated[str, typer.Argument(help="gpus | fabrics | clusters | all.")] = "all",
) -> None:
    """List hardware presets: GPUs, fabrics and clusters (use the ids with --gpu and --cluster).

    Examples:
      planner hw list
      planner hw list gpus
    """
    from planner.io.presets import preset_ids, suggest  # noqa: PLC0415

    if kind not in (*_HW_KINDS, "all"):
        hint = suggest(kind, [*_HW_KINDS, "all"])
        raise InputError("KIND", kind, "gpus, fabrics, clusters or all" + (f" ({hint})" if hint else ""))
    con = console()
    builders = {"gpus": ("GPUs (--gpu)", _gpu_table), "fabrics": ("Fabrics (inter-node networks)", _fabric_table),
                "clusters": ("Clusters (--cluster)", _cluster_table)}
    for k in _HW_KINDS if kind == "all" else (kind,):
        title, build = builders[k]
        con.print(Text(title, style="bold"))
        con.print(build(preset_ids(k)))


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, str]]:
    rows = []
    for k, v in d.items():
        if isinstance(v, dict):
            rows += _flatten(v, f"{prefix}{k}.")
        elif isinstance(v, list):
            rows.append((f"{prefix}{k}", "; ".join(str(x) for x in v)))
        else:
            rows.append((f"{prefix}{k}", str(v)))
    return rows


@hw_app.command("show")
def hw_show(name: Annotated[str, typer.Argument(help="A GPU, fabric or cluster preset id.")]) -> None:
    """Show one hardware preset with every field and its sources.

    Examples:
      planner hw show h100-sxm5-80gb
      planner hw show dgx-h100-superpod
    """
    from planner.io.presets import preset_ids, read_preset, suggest  # noqa: PLC0415

    key = name.lower()
    kind = next((k for k in _HW_KINDS if key in preset_ids(k)), None)
    if kind is None:
        every = [i for k in _HW_KINDS for i in preset_ids(k)]
        hint = suggest(key, every)
        raise InputError("hw", name, "a GPU, fabric or cluster preset id" + (f" ({hint})" if hint else " (planner hw list)"))
    t = compact_table(show_header=False)
    t.add_column("field", style="bold", no_wrap=True)
    t.add_column("value")
    for k, v in _flatten(read_preset(kind, key)):
        t.add_row(k, v)
    con = console()
    con.print(Text(f"{kind[:-1]} {key}", style="bold"))
    con.print(t)
