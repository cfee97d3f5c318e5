"""The shipped presets: every GPU, fabric, cluster and model file loads, cites its sources,
carries the figures the validation data relies on, and (for models) has a shape whose
parameter count matches the count its source publishes.

The parameter counter here is deliberately independent of the package's own counter, so
that a wrong shape in a preset and a wrong formula in the package cannot hide each other.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from planner.io.loaders import load_cluster, load_gpu, load_model, make_cluster
from planner.io.presets import preset_dir, preset_ids, read_preset
from planner.specs import INTER_KINDS, INTRA_KINDS

REPO = Path(__file__).resolve().parents[2]
from conftest import VALIDATION  # noqa: E402  (the shipped runs files)

REQUIRED_GPUS = {
    "v100-sxm2-32gb", "a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h800-sxm5-80gb",
    "h200-sxm-141gb", "b200-sxm-180gb", "mi300x", "h100-hbm2e-96gb",
}
REQUIRED_FABRICS = {"hdr-ib", "ndr-ib", "xdr-ib", "roce-400", "roce-200", "ethernet-100", "efa-v2", "omnipath-100"}
REQUIRED_CLUSTERS = {
    "dgx-a100-superpod", "dgx-h100-superpod", "dgx-h200", "gb200-nvl72", "pcie-8gpu-a100",
    "ethernet-cloud-h100", "meta-grand-teton-h100", "vtrain-a100",
}
REQUIRED_MODELS = {
    "gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b",
    "gpt-1t", "llama2-7b", "llama2-13b", "llama2-70b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b",
    "mistral-7b", "qwen2.5-7b", "qwen2.5-72b", "bloom-176b", "opt-175b", "gpt-neox-20b", "nemotron-4-340b",
    "falcon-40b", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3",
    "gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18.4b", "gpt-39.1b", "gpt-76.1b", "gpt-145.6b", "gpt-310.1b", "gpt-529.6b",
}
QWEN_MOE = {"qwen2-57b-a14b", "qwen3-30b-a3b"}

GPU_KEYS = {
    "id", "name", "memory_gib", "hbm_bandwidth_gbs", "peak_tflops", "matmul_ceiling", "nvlink_gbs_per_direction",
    "nvlink_generation", "intra_node", "gpus_per_node", "sm_count", "tdp_w", "sources",
}
FABRIC_KEYS = {"id", "name", "kind", "gbps_per_nic", "latency_us", "efficiency", "sources"}
CLUSTER_KEYS = {"name", "gpu", "num_gpus", "gpus_per_node", "intra_node", "inter_node", "sources"}

GPUS = preset_ids("gpus")
FABRICS = preset_ids("fabrics")
CLUSTERS = preset_ids("clusters")
MODELS = preset_ids("models")


def _raw(kind: str, name: str) -> dict:
    """The file as written (not through the lower-casing preset lookup)."""
    return yaml.safe_load((preset_dir(kind) / f"{name}.yaml").read_text())


def _sources_ok(d: dict) -> bool:
    s = d.get("sources")
    return isinstance(s, list) and len(s) > 0 and all(isinstance(x, str) and x.strip() for x in s)


# --- presence ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kind, required",
    [("gpus", REQUIRED_GPUS), ("fabrics", REQUIRED_FABRICS), ("clusters", REQUIRED_CLUSTERS), ("models", REQUIRED_MODELS)],
)
def test_required_presets_exist(kind, required):
    missing = sorted(required - set(preset_ids(kind)))
    assert not missing, f"missing {kind} presets: {missing}"


def test_a_qwen_moe_preset_exists():
    assert QWEN_MOE & set(MODELS)


# --- GPUs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("gid", GPUS)
def test_gpu_loads_and_is_complete(gid):
    d = _raw("gpus", gid)
    assert d["id"] == gid, "id must equal the file stem"
    assert not (GPU_KEYS - set(d)), f"missing keys {sorted(GPU_KEYS - set(d))}"
    assert _sources_ok(d)
    g = load_gpu(gid)
    assert g.id == gid
    assert g.intra_node in INTRA_KINDS
    assert set(g.peak_flops) <= {"fp16", "bf16", "fp8", "tf32"}
    for prec, c in g.matmul_ceiling.items():
        assert prec in g.peak_flops, f"ceiling for {prec} without a peak"
        assert 0.3 < c <= 1.0, (prec, c)
    # a dense peak, not a sparsity figure: fp8 is about twice the 16-bit peak, not four times
    # (L40S's spec sheet prints 733 vs 362.05, a ratio of 2.02)
    if "fp8" in g.peak_flops:
        assert g.peak_flops["fp8"] <= 2.05 * g.peak_flops["bf16"]
    if g.intra_node == "pcie":
        assert g.nvlink_bandwidth_bytes_per_s == 0
    else:
        assert g.nvlink_bandwidth_bytes_per_s > 0
    assert g.memory_bytes > 8 * 2**30 and g.hbm_bandwidth_bytes_per_s > 1e11


# Dense peaks stated in ../shared/validation/README.md (TFLOP/s).
README_PEAKS = {
    "v100-sxm2-32gb": {"fp16": 125},
    "a100-sxm4-40gb": {"fp16": 312, "bf16": 312},
    "a100-sxm4-80gb": {"fp16": 312, "bf16": 312},
    "h100-sxm5-80gb": {"bf16": 989, "fp8": 1979},
    "h800-sxm5-80gb": {"bf16": 989, "fp8": 1979},
    "h200-sxm-141gb": {"bf16": 989, "fp8": 1979},
    "b200-sxm-180gb": {"bf16": 2250, "fp8": 4500},
}


@pytest.mark.parametrize("gid", sorted(README_PEAKS))
def test_gpu_dense_peaks_match_validation_readme(gid):
    g = load_gpu(gid)
    for prec, tflops in README_PEAKS[gid].items():
        assert g.peak_flops[prec] == pytest.approx(tflops * 1e12, rel=1e-3), (gid, prec)


def test_gpu_specific_figures():
    assert load_gpu("h800-sxm5-80gb").nvlink_bandwidth_bytes_per_s == pytest.approx(200e9)  # 400 GB/s bidirectional
    assert load_gpu("h100-sxm5-80gb").nvlink_bandwidth_bytes_per_s == pytest.approx(450e9)
    h96 = load_gpu("h100-hbm2e-96gb")
    assert h96.hbm_bandwidth_bytes_per_s == pytest.approx(2.4e12) and h96.tdp_w == 500
    assert h96.ceiling("bf16") < load_gpu("h100-sxm5-80gb").ceiling("bf16")  # the 500 W cap
    v100 = load_gpu("v100-sxm2-32gb")
    assert set(v100.peak_flops) == {"fp16"}  # Volta has no BF16, TF32 or FP8 tensor cores
    import planner  # noqa: PLC0415

    with pytest.raises(planner.InputError, match="job.precision"):
        planner.estimate(planner.load_model("gpt3-1.3b"), planner.make_cluster("v100-sxm2-32gb", 8), planner.Job(2048, 64),
                         planner.ParallelConfig())
    assert load_gpu("h200-sxm-141gb").hbm_bandwidth_bytes_per_s == pytest.approx(4.8e12)
    assert load_gpu("mi300x").intra_node == "xgmi"


def test_validation_runs_name_known_gpus():
    files = sorted(VALIDATION.glob("*runs*.json"))
    assert len(files) == 5, files
    if not files:
        pytest.skip("no validation runs files next to the checkout")
    used = set()
    for f in files:
        for r in json.loads(f.read_text()).get("runs", []):
            used.add(r["hardware"]["gpu"])
    assert used <= set(GPUS), sorted(used - set(GPUS))


# --- fabrics -------------------------------------------------------------------------------

@pytest.mark.parametrize("fid", FABRICS)
def test_fabric_is_complete_and_usable(fid):
    d = _raw("fabrics", fid)
    assert d == read_preset("fabrics", fid)
    assert d["id"] == fid
    assert not (FABRIC_KEYS - set(d)), f"missing keys {sorted(FABRIC_KEYS - set(d))}"
    assert _sources_ok(d)
    assert d["kind"] in INTER_KINDS and d["kind"] != "none"
    assert 0 < d["efficiency"] <= 1 and d["latency_us"] > 0
    # a fabric is usable as a cluster's inter_node block through the loader
    c = make_cluster(
        "a100-sxm4-80gb", 16,
        inter_node={"kind": d["kind"], "gbps_per_nic": d["gbps_per_nic"], "nics_per_node": 1,
                    "latency_us": d["latency_us"], "efficiency": d["efficiency"]},
    )
    assert c.inter.gbps_per_nic == d["gbps_per_nic"]
    assert c.inter.latency_s == pytest.approx(d["latency_us"] * 1e-6)


def test_fabric_line_rates():
    rates = {f: _raw("fabrics", f)["gbps_per_nic"] for f in REQUIRED_FABRICS}
    assert rates["hdr-ib"] == 200 and rates["ndr-ib"] == 400 and rates["xdr-ib"] == 800
    assert rates["roce-400"] == 400 and rates["roce-200"] == 200 and rates["ethernet-100"] == 100
    assert rates["omnipath-100"] == 100


# --- clusters ------------------------------------------------------------------------------

@pytest.mark.parametrize("cid", CLUSTERS)
def test_cluster_loads(cid):
    d = _raw("clusters", cid)
    assert not (CLUSTER_KEYS - set(d)), f"missing keys {sorted(CLUSTER_KEYS - set(d))}"
    assert _sources_ok(d)
    assert d["gpu"] in GPUS
    c = load_cluster(cid)
    assert c.num_gpus == d["num_gpus"] and c.gpus_per_node == d["gpus_per_node"]
    assert c.num_gpus % c.gpus_per_node == 0
    assert c.inter.kind == d["inter_node"]["kind"]
    assert c.intra.kind == d["intra_node"].get("kind", c.gpu.intra_node)
    assert c.inter.node_bytes_per_s > 0 and c.intra.usable_bytes_per_s > 0


def test_cluster_specific_figures():
    nvl = load_cluster("gb200-nvl72")
    assert nvl.gpus_per_node == 4 and nvl.intra.domain_size == 72 and nvl.nvlink_domain == 72
    assert nvl.intra.bandwidth_bytes_per_s == pytest.approx(900e9)
    a100 = load_cluster("dgx-a100-superpod")
    assert (a100.inter.gbps_per_nic, a100.inter.nics_per_node) == (200, 8)
    h100 = load_cluster("dgx-h100-superpod")
    assert (h100.inter.gbps_per_nic, h100.inter.nics_per_node) == (400, 8)
    vt = load_cluster("vtrain-a100")
    assert vt.gpu.id == "a100-sxm4-80gb" and (vt.inter.gbps_per_nic, vt.inter.nics_per_node) == (200, 4)
    pcie = load_cluster("pcie-8gpu-a100")
    assert pcie.intra.kind == "pcie" and pcie.inter.kind == "ethernet"
    assert load_cluster("meta-grand-teton-h100").inter.kind == "roce"
    # a cluster preset can be resized
    assert load_cluster("dgx-h100-superpod", num_gpus=64).num_gpus == 64


# --- models --------------------------------------------------------------------------------

LEARNED_POSITION_FAMILIES = {"gpt3", "megatron-gpt", "opt"}  # absolute position embedding tables


def count_params(d: dict) -> int:
    """Parameters of a decoder-only transformer described by a model preset mapping.

    Embeddings (+ an untied output layer) + per layer: attention (GQA or MLA) and MLP
    (2 matrices, or 3 for SwiGLU; every expert for MoE, plus the router) and two norms
    + a final norm + learned position embeddings where the family has them.
    """
    h, L, V = d["hidden"], d["layers"], d["vocab"]
    a = d["heads"]
    kv = d.get("kv_heads") or a
    hd = d.get("head_dim") or h // a
    mlp = d.get("mlp", "gelu")
    bias = bool(d.get("bias", mlp == "gelu"))
    norm = 2 * h if d.get("norm", "layernorm" if mlp == "gelu" else "rmsnorm") == "layernorm" else h

    if d.get("kv_lora_rank"):  # multi-head latent attention (DeepSeek-V2/V3)
        qr, kr = d.get("q_lora_rank", 0), d["kv_lora_rank"]
        rope, vd = d["qk_rope_head_dim"], d["v_head_dim"]
        q = (h * qr + qr + qr * a * (hd + rope)) if qr else h * a * (hd + rope)
        kv_p = h * (kr + rope) + kr + kr * a * (hd + vd)
        attn = q + kv_p + a * vd * h
    else:
        attn = h * a * hd + 2 * h * kv * hd + a * hd * h
        if bias:
            attn += a * hd + 2 * kv * hd + h

    n_mat = 3 if mlp == "swiglu" else 2

    def ffn(f: int) -> int:
        return n_mat * h * f + (((n_mat - 1) * f + h) if bias else 0)

    moe = d.get("moe")
    if moe:
        dense = moe.get("dense_layers", 0)
        experts = moe["experts"] + moe.get("shared_experts", 0)
        moe_layer = attn + experts * ffn(moe["expert_ffn_hidden"]) + h * moe["experts"] + 2 * norm
    else:
        dense, moe_layer = L, 0
    total = dense * (attn + ffn(d["ffn_hidden"]) + 2 * norm) + (L - dense) * moe_layer
    total += V * h * (1 if d.get("tied_embeddings", True) else 2) + norm
    if d.get("family") in LEARNED_POSITION_FAMILIES:
        total += d["max_seq_len"] * h
    return total


def test_counter_on_known_shapes():
    # GPT-3 175B: 12*L*h^2 dominates; with embeddings 174.6B (Narayanan et al. label it 174.6B)
    gpt3 = _raw("models", "gpt3-175b")
    assert count_params(gpt3) / 1e9 == pytest.approx(174.6, abs=0.1)
    # Llama 2 7B: 6,738,415,616 parameters in the Hugging Face checkpoint
    assert count_params(_raw("models", "llama2-7b")) == 6_738_415_616


@pytest.mark.parametrize("mid", MODELS)
def test_model_loads_and_is_cited(mid):
    d = _raw("models", mid)
    assert d["id"] == mid
    assert _sources_ok(d)
    m = load_model(mid)
    assert m.layers == d["layers"] and m.hidden == d["hidden"] and m.vocab == d["vocab"]
    assert m.heads * m.head_dim == d["heads"] * (d.get("head_dim") or d["hidden"] // d["heads"])
    assert d.get("max_seq_len", 0) >= 2048
    if d.get("moe"):
        assert m.moe is not None and m.moe.experts == d["moe"]["experts"]
    if mid == "deepseek-v3":
        assert m.is_mla and (m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim, m.v_head_dim) == (1536, 512, 64, 128)
        assert m.moe_layers == 58 and m.moe.top_k == 8 and m.moe.shared_experts == 1


@pytest.mark.parametrize("mid", [m for m in MODELS if "published_params_b" in _raw("models", m)])
def test_model_parameter_count_matches_published(mid):
    d = _raw("models", mid)
    counted = count_params(d) / 1e9
    published = d["published_params_b"]
    assert abs(counted - published) / published < 0.05, f"{mid}: counted {counted:.2f}B vs published {published}B"


def test_every_model_states_a_published_count():
    assert not [m for m in MODELS if "published_params_b" not in _raw("models", m)]


def test_a_clusters_default_network_is_its_gpus_reference_node():
    """Without --nic-gbps/--cluster, a cluster gets the scale-out network of the GPU's reference
    node (DGX A100: 8 x 200 Gb/s HDR; DGX-1: 4 x 100 Gb/s EDR), else 8 x 400 Gb/s (DGX H100/B200);
    an explicit network wins."""
    from planner.io.loaders import make_cluster  # noqa: PLC0415

    net = lambda c: (c.inter.kind, c.inter.gbps_per_nic, c.inter.nics_per_node)  # noqa: E731
    assert net(make_cluster("a100-sxm4-80gb", 64)) == ("infiniband", 200.0, 8)
    assert net(make_cluster("v100-sxm2-32gb", 64)) == ("infiniband", 100.0, 4)
    assert net(make_cluster("h100-sxm5-80gb", 64)) == ("infiniband", 400.0, 8)
    assert net(make_cluster("a100-sxm4-80gb", 64, inter_node={"kind": "roce", "gbps_per_nic": 400, "nics_per_node": 8})) == ("roce", 400.0, 8)
