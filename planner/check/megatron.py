"""Megatron-LM: a launch script (or a flags file) -> model, job, parallel configuration.

Every flag of ``pretrain_gpt.py`` is classified (``data/megatron_flags.yaml``); the cost flags
are mapped here with Megatron-LM's own defaults and rules (file:line of the snapshot's
megatron/training/arguments.py, transformer_config.py, model_parallel_config.py;
docs/research/megatron.md has them). Settings Megatron leaves off when absent (the
overlaps, the distributed optimizer) are set off explicitly, not left to the planner's
engine defaults. Flags of the 2021 engine (``--DDP-impl``, ``--activations-checkpoint-method``)
make the job a ``megatron-legacy`` one.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

from planner.check.job import Draft
from planner.check.megatron_args import Parsed, detect_legacy, flag_table, parse_argv
from planner.check.megatron_launch import Launch, find_launch, flags_file_fields, is_flags_file
from planner.check.bash_expand import text_of
from planner.engines import get_engine, supports_flash
from planner.errors import InputError
from planner.io.presets import preset_ids, read_preset

__all__ = ["read_megatron", "megatron_job", "parse_layout", "layer_freq"]

# Vocabulary of the tokenizers Megatron names without a --vocab-size.
_TOKENIZER_VOCAB = {
    "GPT2BPETokenizer": (50257, "GPT-2 BPE (Radford et al. 2019)"),
    "Llama2Tokenizer": (32000, "Llama 2 SentencePiece (Touvron et al. 2023, sec. 2.1)"),
}


def read_megatron(path: Path) -> Draft:
    """The draft of the Megatron job in ``path`` (launch script or flags file)."""
    if is_flags_file(path):
        fields, launch = flags_file_fields(path), None
    else:
        launch = find_launch(path)
        fields = launch.args
    return megatron_job(fields, path, launch)


def megatron_job(fields: list, path: Path, launch: Launch | None, fmt: str = "megatron", extra: dict | None = None) -> Draft:
    words = [text_of(f) for f in fields]
    legacy = detect_legacy(words) or (["Megatron-DeepSpeed"] if extra else [])
    p = parse_argv(fields, path.name, legacy=bool(legacy), extra=extra)
    d = Draft(fmt=fmt, engine="megatron-legacy" if legacy else "megatron-core", files=[str(path)], model_id=path.stem)
    d.raw = p  # type: ignore[attr-defined]
    if legacy:
        d.notes.append(f"read as the 2021 engine (megatron-legacy): {', '.join(sorted(set(legacy)))} are Megatron-LM v2 flags that "
                       "the current parser no longer has (the SC21 README pins commit 6985e58)")
    _classify(d, p)
    _positive_ints(p)
    for flag in p.split_words:
        d.findings.append(("shell-word-splitting", f"{_src(p, flag)}: the quoted value of {flag} ({p.one(flag)!r}) reaches Megatron as "
                           f"{len(p.one(flag).split())} words because the array is expanded unquoted (${{ARR[@]}}): argparse rejects the "
                           "extra words (unrecognized arguments). Quote the expansion (\"${ARR[@]}\"); read here as one value"))
    _world(d, p, launch, path)
    _model(d, p)
    _job(d, p)
    _parallel(d, p)
    from planner.check.edits import MegatronEditor  # noqa: PLC0415

    d.editor = MegatronEditor(path, p, fields, launch)
    return d


# Sizes and degrees the reader prices: argparse reads each as an int (type=int) and the job needs
# it to be at least 1 (a degree of 0 divides the world by zero; Megatron-LM asserts the batch sizes).
_POSITIVE_INT_FLAGS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                       "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--virtual-pipeline-model-parallel-size",
                       "--num-layers-per-virtual-pipeline-stage", "--num-layers", "--hidden-size", "--ffn-hidden-size",
                       "--num-attention-heads", "--num-query-groups", "--kv-channels", "--seq-length", "--max-position-embeddings",
                       "--micro-batch-size", "--global-batch-size", "--batch-size", "--vocab-size", "--num-experts", "--moe-router-topk",
                       "--moe-ffn-hidden-size")


def _positive_ints(p: Parsed) -> None:
    for flag in _POSITIVE_INT_FLAGS:
        v = p.one(flag)
        if v is None:
            continue
        try:
            n = int(v)
        except ValueError:
            raise InputError(_src(p, flag), v, "an integer (argparse type=int)") from None
        if n < 1:
            raise InputError(_src(p, flag), n, "a positive integer")


def _classify(d: Draft, p: Parsed) -> None:
    t = flag_table()
    for flag in dict.fromkeys(p.order):
        role, meaning = t.role(flag, p.legacy)
        value = " ".join(p.many(flag) or [])
        if role == "ignored":
            d.ignored.append(f"{flag} ({meaning})")
        elif role == "unmodelled":
            if t.is_default(flag, p.many(flag) or []):
                d.ignored.append(f"{flag} {value} (its default)")
            elif flag in ("--hidden-dropout", "--attention-dropout"):
                continue  # judged with the model's biases in _dropout
            else:
                d.unmodelled.append(f"{flag}{' ' + value if value else ''}: {meaning}")
        elif role == "rejected" and not (p.legacy and flag in t.legacy):
            raise InputError(f"{p.line(flag)} {flag}", value or True, t.rejected[flag])


def _src(p: Parsed, flag: str) -> str:
    return f"{p.line(flag)} {flag}"


def _set(d: Draft, name: str, value, p: Parsed, flag: str | None, default_where: str) -> None:
    if flag is not None and p.has(flag):
        d.set(name, value, "file", _src(p, flag))
    else:
        d.set(name, value, "default", default_where)


def _world(d: Draft, p: Parsed, launch: Launch | None, path: Path) -> None:
    if launch is not None and launch.world:
        envs = [v for v in launch.defaults if re.search(r"N?NODES$|NUM_NODES|GPUS_PER_NODE|NPROC|WORLD_SIZE|NODE_COUNT", v)]
        kind = "default" if envs else "file"
        where = launch.world_where + (f" (defaults of ${', $'.join(envs)})" if envs else "")
        d.set("hardware.num_gpus", launch.world, kind, where)
        if launch.nproc_per_node:
            d.set("hardware.gpus_per_node", launch.nproc_per_node, kind, where)
        return
    tp, pp, cp, ep = (p.int(f, 1) for f in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                             "--context-parallel-size", "--expert-model-parallel-size"))
    dp = ep // math.gcd(ep, cp)
    why = "no launcher in the file" if launch is None else "the launcher's world is not a number (a template or an unset variable)"
    d.set("hardware.num_gpus", tp * pp * cp * dp, "default", f"the smallest world the degrees need ({why}; pass --gpus)")
    def note(dd: Draft, cluster) -> None:  # unless --gpus gave it
        if dd.values["hardware.num_gpus"][1].kind == "default":
            dd.notes.append(f"the GPU count is not in the file ({why}): priced on {cluster.num_gpus}, the smallest world its "
                            "degrees need; pass --gpus for the job's own")
    d.post.append(note)


def _vocab(d: Draft, p: Parsed) -> None:
    div = p.int("--make-vocab-size-divisible-by", 128)
    tp = p.int("--tensor-model-parallel-size", 1)
    d.post.append(lambda dd, cluster: _padded_note(dd, div * tp))
    if p.has("--vocab-size"):
        d.set("model.vocab", p.int("--vocab-size"), "file", _src(p, "--vocab-size"))
        return
    if p.has("--padded-vocab-size"):
        d.set("model.vocab", p.int("--padded-vocab-size"), "file", _src(p, "--padded-vocab-size"))
        return
    model = p.one("--tokenizer-model")
    if model:
        for pid in preset_ids("models"):
            src = read_preset("models", pid)
            refs = " ".join(src.get("sources") or []) if isinstance(src.get("sources"), list) else str(src.get("sources", ""))
            if model.strip("/").lower() in refs.lower() and src.get("vocab"):
                d.set("model.vocab", src["vocab"], "file", f"{_src(p, '--tokenizer-model')} {model} (vocab of preset {pid})")
                return
    tok = p.one("--tokenizer-type")
    if p.has("--vocab-file") and tok is None:
        tok = "GPT2BPETokenizer"
    if tok in _TOKENIZER_VOCAB:
        n, what = _TOKENIZER_VOCAB[tok]
        d.set("model.vocab", n, "file", f"{_src(p, '--tokenizer-type' if p.has('--tokenizer-type') else '--vocab-file')} {tok}: {what}")
        return
    d.set("model.vocab", 50257, "default", "GPT-2 BPE (no --vocab-size and no tokenizer the planner knows; pass --model to set the shape)")
    if model or tok:
        d.notes.append(f"vocabulary assumed 50257 (GPT-2 BPE): the tokenizer {model or tok} is not one the planner knows the size of; "
                       "pass --model PRESET or add --vocab-size to price the real embedding and loss")


def _padded_note(d: Draft, multiple: int) -> None:
    v = d.get("model.vocab")
    if v and v % multiple:
        padded = -(-v // multiple) * multiple
        d.notes.append(f"Megatron pads the vocabulary to {padded} (--make-vocab-size-divisible-by x tp = {multiple}, "
                       f"megatron/training/vocab_utils.py calculate_padded_vocab_size); priced unpadded at {v}, as the planner's presets")


def _model(d: Draft, p: Parsed) -> None:
    for name, flag in (("layers", "--num-layers"), ("hidden", "--hidden-size"), ("heads", "--num-attention-heads")):
        if p.has(flag):
            d.set(f"model.{name}", p.int(flag), "file", _src(p, flag))
    h, a = p.int("--hidden-size"), p.int("--num-attention-heads")
    glu = p.has("--swiglu") or p.has("--quick-geglu")
    if p.has("--ffn-hidden-size"):
        d.set("model.ffn_hidden", p.int("--ffn-hidden-size"), "file", _src(p, "--ffn-hidden-size"))
    elif h:
        ffn = int((4 * h * 2 / 3) / 64) * 64 if p.has("--swiglu") else 4 * h
        d.set("model.ffn_hidden", ffn, "default", "Megatron default: 4h, or int(8h/3/64)*64 with --swiglu (arguments.py:1320-1329)")
    mla = p.has("--multi-latent-attention")
    if mla:
        d.set("model.kv_heads", a, "file", _src(p, "--multi-latent-attention"))
    elif p.has("--group-query-attention"):
        _set(d, "model.kv_heads", p.int("--num-query-groups", 1), p, "--num-query-groups", "Megatron default: 1 query group (transformer_config.py:175)")
    elif a:
        d.set("model.kv_heads", a, "default", "Megatron default: multi-head attention (no --group-query-attention)")
    if mla:
        _set(d, "model.head_dim", p.int("--qk-head-dim", 128), p, "--qk-head-dim", "Megatron default --qk-head-dim 128 (arguments.py:3552)")
        _set(d, "model.q_lora_rank", p.int("--q-lora-rank", 0) or 0, p, "--q-lora-rank", "Megatron default: no query compression (arguments.py:3548)")
        _set(d, "model.kv_lora_rank", p.int("--kv-lora-rank", 32), p, "--kv-lora-rank", "Megatron CLI default 32 (arguments.py:3550)")
        _set(d, "model.qk_rope_head_dim", p.int("--qk-pos-emb-head-dim", 64), p, "--qk-pos-emb-head-dim", "Megatron default 64 (arguments.py:3554)")
        _set(d, "model.v_head_dim", p.int("--v-head-dim", 128), p, "--v-head-dim", "Megatron default 128 (arguments.py:3556)")
    elif p.has("--kv-channels"):
        d.set("model.head_dim", p.int("--kv-channels"), "file", _src(p, "--kv-channels"))
    elif h and a:
        if h % a:
            raise InputError(f"{p.where}: --hidden-size / --num-attention-heads", f"{h} / {a}", "a whole head dimension or --kv-channels")
        d.set("model.head_dim", h // a, "default", "Megatron default: hidden / heads (arguments.py:1331)")
    mlp = "swiglu" if glu else ("relu2" if p.has("--squared-relu") else "gelu")
    _set(d, "model.mlp", mlp, p, "--swiglu" if p.has("--swiglu") else ("--quick-geglu" if glu else "--squared-relu"),
         "Megatron default: GeLU MLP")
    # RMSNorm (Megatron-LM), rmsnorm (Megatron-DeepSpeed, whose flag table megatron_ds.DS_FLAGS gives)
    norm = "rmsnorm" if (p.one("--normalization") or "").lower() == "rmsnorm" else "layernorm"
    _set(d, "model.norm", norm, p, "--normalization", "Megatron default: LayerNorm (transformer_config.py:256)")
    _set(d, "model.bias", not p.has("--disable-bias-linear"), p, "--disable-bias-linear", "Megatron default: linear biases")
    _set(d, "model.tied_embeddings", not p.has("--untie-embeddings-and-output-weights"), p, "--untie-embeddings-and-output-weights",
         "Megatron default: tied input and output embeddings")
    pos = p.one("--position-embedding-type", "learned_absolute")
    if p.has("--use-rotary-position-embeddings"):
        pos = "rope"
    if p.has("--no-position-embedding") and pos == "learned_absolute":
        pos = "none"
    kind = "learned" if pos == "learned_absolute" else "rope"
    if pos in ("none", "relative"):
        d.notes.append(f"--position-embedding-type {pos}: priced as rope (no position table)")
    _set(d, "model.position_embedding", kind, p, "--position-embedding-type", "Megatron default: learned_absolute (arguments.py:2397)")
    mpe, seq = p.int("--max-position-embeddings"), p.int("--seq-length")
    if kind == "learned" and mpe and seq and mpe != seq:
        d.notes.append(f"--max-position-embeddings {mpe}: the learned position table is priced with {seq} rows (--seq-length)")
    if kind == "rope":
        _set(d, "model.rope_theta", float(p.int("--rotary-base", 10000)), p, "--rotary-base", "Megatron default rotary base 10000 (arguments.py:2418)")
    _set(d, "model.mtp_layers", p.int("--mtp-num-layers", 0) or 0, p, "--mtp-num-layers", "Megatron default: no multi-token prediction")
    if not p.has("--multi-latent-attention"):  # with MLA the flag norms the latents, not the heads
        _set(d, "model.qk_norm", p.has("--qk-layernorm"), p, "--qk-layernorm", "Megatron default: no query/key norms")
    _vocab(d, p)
    _moe(d, p)
    _dropout(d, p)


def _dropout(d: Draft, p: Parsed) -> None:
    """The planner keeps dropout masks for models with biases (GPT-style) and none otherwise
    (memory.py); a dropout setting that says otherwise is listed."""
    bias = d.get("model.bias")
    for flag, default in (("--hidden-dropout", 0.1), ("--attention-dropout", 0.1)):
        if not p.has(flag):
            continue
        rate = float(p.one(flag))
        if (rate > 0) == bool(bias):
            d.ignored.append(f"{flag} {p.one(flag)} (as the planner assumes for this model)")
        else:
            d.unmodelled.append(f"{flag} {p.one(flag)}: dropout {'off' if rate == 0 else 'on'}, the planner prices "
                                f"{'masks' if bias else 'none'} for a model {'with' if bias else 'without'} biases")


def layer_freq(expr: str, layers: int, where: str) -> list[int]:
    """``--moe-layer-freq``: an int k (every k-th layer is MoE) or a list expression such as
    ``([0]*3+[1]*58)`` (arguments.py:245-253, 327-350: characters ``,``, digits, ``[]()+*`` only)."""
    s = expr.strip()
    if s.isdigit():
        k = int(s)
        if k < 1:
            raise InputError(where, expr, "a positive layer frequency")
        return [1 if i % k == 0 else 0 for i in range(layers)]
    if set(s) - set("0123456789,[]()+* "):
        raise InputError(where, expr, "an int or a list expression such as ([0]*3+[1]*58)")

    def ev(node):
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            a, b = ev(node.left), ev(node.right)
            return a * b if isinstance(a, list) or isinstance(b, list) else a * b
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return ev(node.left) + ev(node.right)
        raise InputError(where, expr, "a list expression of 0/1 lists joined by + and *")

    try:
        out = ev(ast.parse(s, mode="eval").body)
    except SyntaxError:
        raise InputError(where, expr, "a list expression such as ([0]*3+[1]*58)") from None
    if not isinstance(out, list) or len(out) != layers or set(out) - {0, 1}:
        raise InputError(where, expr, f"a 0/1 pattern of {layers} layers")
    return out


def _moe(d: Draft, p: Parsed) -> None:
    n = p.int("--num-experts", 0) or 0
    if not n:
        return
    layers = p.int("--num-layers", 0)
    ffn = d.get("model.ffn_hidden")
    eff = p.int("--moe-ffn-hidden-size") or ffn
    moe = {"experts": n, "top_k": p.int("--moe-router-topk", 2), "expert_ffn_hidden": eff}
    if p.has("--moe-shared-expert-intermediate-size"):
        size = p.int("--moe-shared-expert-intermediate-size")
        moe["shared_experts"] = max(1, round(size / eff))
        if size % eff:
            d.notes.append(f"--moe-shared-expert-intermediate-size {size}: priced as {moe['shared_experts']} shared experts of {eff}")
    pattern = layer_freq(p.one("--moe-layer-freq", "1"), layers, _src(p, "--moe-layer-freq")) if layers else []
    dense = pattern.count(0)
    lead = next((i for i, x in enumerate(pattern) if x), len(pattern))
    if dense != lead:
        d.notes.append(f"--moe-layer-freq {p.one('--moe-layer-freq')}: {dense} dense layers spread over the model, priced as the first "
                       f"{dense} (the planner places dense layers first, as DeepSeek-V3)")
    moe["dense_layers"] = dense
    if p.has("--moe-expert-capacity-factor"):
        moe["capacity_factor"] = float(p.one("--moe-expert-capacity-factor"))
        if not p.has("--moe-pad-expert-input-to-capacity"):
            d.unmodelled.append("--moe-expert-capacity-factor without --moe-pad-expert-input-to-capacity: experts hold up to "
                                "the capacity (tokens over it dropped), priced as padded to it")
    d.set("model.moe", moe, "file", _src(p, "--num-experts"))
    if not p.has("--moe-token-dispatcher-type"):
        d.unmodelled.append("--moe-token-dispatcher-type not set: Megatron's default allgather dispatcher (TransformerConfig), "
                            "priced as the all-to-all one")
    kind = p.one("--moe-token-dispatcher-type") if p.has("--moe-token-dispatcher-type") else None
    if kind == "flex" or p.has("--moe-enable-deepep"):
        # TransformerConfig: flex with --moe-flex-dispatcher-backend (default deepep; the deprecated
        # --moe-enable-deepep sets deepep)
        backend = "deepep" if p.has("--moe-enable-deepep") else (p.one("--moe-flex-dispatcher-backend") or "deepep")
        if backend not in ("deepep", "hybridep"):
            d.unmodelled.append(f"--moe-flex-dispatcher-backend {backend}: priced as the all-to-all dispatcher")
            backend = "alltoall"
        d.set("parallel.moe_dispatcher", backend, "file", _src(p, "--moe-token-dispatcher-type" if kind else "--moe-enable-deepep"))
    else:
        d.default("parallel.moe_dispatcher", "alltoall", "the all-to-all (or allgather) dispatcher")


def _cuda_graph(d: Draft, p: Parsed) -> None:
    """CUDA graphs (TransformerConfig.cuda_graph_impl, transformer_config.py:1075): local or transformer_engine with
    no --cuda-graph-modules capture whole layers (the planner's ``layer``); full_iteration, or
    full_iteration in the modules (or in their deprecated alias --cuda-graph-scope, which
    Megatron migrates: cuda_graph_config.py), the whole step; the deprecated --enable-cuda-graph /
    --external-cuda-graph are local / transformer_engine (arguments.py:611-629). A module subset (attn,
    moe_router, ...) is not a planner setting: priced as eager launches."""
    impl = p.one("--cuda-graph-impl") if p.has("--cuda-graph-impl") else None
    flag = "--cuda-graph-impl"
    if impl is None and p.has("--enable-cuda-graph"):
        impl, flag = "local", "--enable-cuda-graph"
    elif impl is None and p.has("--external-cuda-graph"):
        impl, flag = "transformer_engine", "--external-cuda-graph"
    listed = list(p.many("--cuda-graph-modules") or []) + list(p.many("--cuda-graph-scope") or [])
    if impl == "full_iteration" or "full_iteration" in listed:
        where = flag if impl == "full_iteration" else ("--cuda-graph-modules" if p.has("--cuda-graph-modules") else "--cuda-graph-scope")
        d.set("parallel.cuda_graph", "full_iteration", "file", _src(p, where))
        return
    if impl in (None, "none"):
        d.default("parallel.cuda_graph", "none", "Megatron default: no CUDA graphs (TC cuda_graph_impl none)")
        return
    modules = [m for m in listed if m not in ("full", "full_iteration_inference")]  # both mean the whole layer in training
    if modules:
        d.unmodelled.append(f"{flag} {impl} with graphed modules {' '.join(modules)}: graphs of part of each layer, "
                            "priced as eager launches")
        d.set("parallel.cuda_graph", "none", "file", _src(p, "--cuda-graph-modules" if p.has("--cuda-graph-modules") else "--cuda-graph-scope"))
    else:
        d.set("parallel.cuda_graph", "layer", "file", _src(p, flag))


def _job(d: Draft, p: Parsed) -> None:
    seq = p.int("--seq-length") or p.int("--decoder-seq-length") or p.int("--encoder-seq-length")
    if seq:
        d.set("job.seq_len", seq, "file", _src(p, "--seq-length"))
    if p.has("--global-batch-size"):
        d.set("job.global_batch_size", p.int("--global-batch-size"), "file", _src(p, "--global-batch-size"))
        if p.has("--step-batch-size-schedule") or p.has("--rampup-batch-size"):
            other = "--step-batch-size-schedule" if p.has("--step-batch-size-schedule") else "--rampup-batch-size"
            d.findings.append(("megatron-rejects", f"{_src(p, other)} with --global-batch-size: Megatron's validate_args refuses both "
                               "(arguments.py:698-701); priced at --global-batch-size, the batch the schedule ends at"))
    if p.has("--fp8-format"):
        prec, flag = "fp8", "--fp8-format"
        if not (p.has("--bf16") or p.has("--fp16")):
            raise InputError(f"{_src(p, '--fp8-format')}", p.one("--fp8-format"), "--bf16 or --fp16 beside it (FP8 runs on a 16-bit base)")
    elif p.has("--bf16"):
        prec, flag = "bf16", "--bf16"
    elif p.has("--fp16"):
        prec, flag = "fp16", "--fp16"
    elif d.fmt == "megatron-deepspeed":
        return  # the DeepSpeed JSON says
    else:
        raise InputError(f"{p.where}: --bf16 / --fp16", "neither", "a 16-bit or FP8 run (without them Megatron trains in fp32, "
                         "which the planner does not price)")
    d.set("job.precision", prec, "file", _src(p, flag))
    if prec == "fp8":
        if p.has("--fp8-recipe"):
            d.set("job.fp8_recipe", p.one("--fp8-recipe"), "file", _src(p, "--fp8-recipe"))
        else:
            d.set("job.fp8_recipe", "delayed", "default", "Megatron default --fp8-recipe delayed (transformer_config.py fp8_recipe)")
        if p.has("--fp8-param-gather"):
            d.set("job.fp8_param_gather", True, "file", _src(p, "--fp8-param-gather"))
        else:
            d.set("job.fp8_param_gather", False, "default", "Megatron default: bf16 weights (no --fp8-param-gather)")
    if d.engine == "megatron-core":
        if p.has("--cross-entropy-loss-fusion"):
            impl = p.one("--cross-entropy-fusion-impl") if p.has("--cross-entropy-fusion-impl") else "native"
            get_engine("megatron-core").launch_loss(impl, _src(p, "--cross-entropy-fusion-impl"))  # te: refused there too
            d.set("job.cross_entropy", impl, "file", _src(p, "--cross-entropy-loss-fusion"))
        else:
            d.set("job.cross_entropy", "unfused", "default",
                  "Megatron default: eager vocab-parallel cross entropy (no --cross-entropy-loss-fusion; model_parallel_config.py)")
    if p.has("--grad-reduce-in-bf16"):
        d.set("job.grad_reduce", "bf16", "file", _src(p, "--grad-reduce-in-bf16"))
    elif prec == "fp16" and p.has("--accumulate-allreduce-grads-in-fp32"):
        d.set("job.grad_reduce", "fp32", "file", _src(p, "--accumulate-allreduce-grads-in-fp32"))
    elif p.has("--use-megatron-fsdp") and p.has("--megatron-fsdp-main-grads-dtype"):
        g = p.one("--megatron-fsdp-main-grads-dtype")
        value = "bf16" if g == "bf16" else ("fp32" if g == "fp32" and prec == "fp16" else "auto")
        d.set("job.grad_reduce", value, "file", _src(p, "--megatron-fsdp-main-grads-dtype"))
    else:
        d.set("job.grad_reduce", "auto", "default", "Megatron default: fp32 main gradients for bf16/fp8, fp16 for fp16")


def parse_layout(layout: str, layers: int, pp: int, where: str, mtp: int = 0) -> tuple[int, tuple[int, ...]]:
    """(vpp, layers per rank) of ``--pipeline-model-parallel-layout``
    (pipeline_parallel_layer_layout.py:276-321): commas dropped, ``(X)*n`` then ``c*n``
    unrolled once each, stages split on ``|``; stage ``v*pp + r`` lives on rank ``r``. The
    ``mtp`` multi-token prediction modules ('m', --mtp-num-layers) follow every 't', as
    validate_layer_layout asks; the planner prices them on the last stage, so they must lie
    there (Megatron also accepts a 'standalone' MTP stage on another rank)."""
    import re  # noqa: PLC0415

    s = layout.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    stages = s.split("|")
    bad = set(s) - set("EtLm|")
    if bad:
        raise InputError(where, layout, f"layer characters E, t, L, m and '|' (got {''.join(sorted(bad))!r})")
    if len(stages) % pp:
        raise InputError(where, layout, f"a number of stages ({len(stages)}) divisible by pp ({pp}) (arguments.py:945)")
    if s.count("t") != layers:
        raise InputError(where, layout, f"{layers} 't' layers (one per --num-layers); it has {s.count('t')}")
    if s.count("E") != 1 or s.count("L") != 1 or not stages[0].startswith("E") or not stages[-1].endswith("L"):
        raise InputError(where, layout, "one E at the start of the first stage and one L at the end of the last")
    if s.count("m") != mtp:
        raise InputError(where, layout, f"{mtp} 'm' modules (one per --mtp-num-layers); it has {s.count('m')}")
    if mtp and not ("t" not in s[s.index("m"):] and stages[-1].count("m") == mtp):
        raise InputError(where, layout, "every 'm' in the last stage after its 't' layers (the planner prices multi-token prediction there)")
    vpp = len(stages) // pp
    per_rank = tuple(sum(stages[v * pp + r].count("t") for v in range(vpp)) for r in range(pp))
    return vpp, per_rank


def _split(d: Draft, p: Parsed, layers: int, pp: int) -> tuple[int, tuple[int, ...] | None, str, str]:
    """(vpp, layers per stage or None for even, flag, where) from the pipeline flags."""
    given = [f for f in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                         "--pipeline-model-parallel-layout") if p.has(f)]
    if len(given) > 1:
        raise InputError(f"{_src(p, given[1])}", " and ".join(given), "at most one of the three (arguments.py:928-939)")
    emb, loss = p.has("--account-for-embedding-in-pipeline-split"), p.has("--account-for-loss-in-pipeline-split")
    first, last = p.int("--decoder-first-pipeline-num-layers"), p.int("--decoder-last-pipeline-num-layers")
    if given == ["--pipeline-model-parallel-layout"]:
        if first or last or emb or loss:
            raise InputError(_src(p, "--pipeline-model-parallel-layout"), "with first/last or account flags", "the layout alone (transformer_config.py:2242-2259)")
        vpp, lps = parse_layout(p.one(given[0]), layers, pp, _src(p, given[0]), p.int("--mtp-num-layers", 0) or 0)
        return vpp, lps, given[0], _src(p, given[0])
    if (first or last) and (emb or loss):
        raise InputError(_src(p, "--decoder-first-pipeline-num-layers" if first else "--decoder-last-pipeline-num-layers"),
                         "with --account-for-*-in-pipeline-split", "one of the two ways (transformer_config.py:2229-2239)")
    Lp = layers + int(emb) + int(loss)
    vpp = 1
    if given == ["--num-layers-per-virtual-pipeline-stage"]:
        n = p.int(given[0])
        if first or last:
            raise InputError(_src(p, given[0]), n, "--num-virtual-stages-per-pipeline-rank with uneven first/last stages (arguments.py:954)")
        if Lp % pp or (Lp // pp) % n:
            raise InputError(_src(p, given[0]), n, f"a divisor of the layers per stage ({Lp} / pp {pp}) (arguments.py:957-975)")
        vpp = (Lp // pp) // n
    elif given == ["--num-virtual-stages-per-pipeline-rank"]:
        vpp = p.int(given[0])
    where = _src(p, given[0]) if given else ""
    if first or last:
        if pp == 1:
            return vpp, None, "", where
        f = first if first is not None else None
        l_ = last if last is not None else None
        mids = pp - (f is not None) - (l_ is not None)
        rest = layers - (f or 0) - (l_ or 0)
        if mids <= 0 and rest:
            raise InputError(_src(p, "--decoder-first-pipeline-num-layers"), f"{first}+{last}", f"the model's {layers} layers on pp {pp}")
        if mids and (rest <= 0 or rest % mids):
            raise InputError(_src(p, "--decoder-first-pipeline-num-layers" if first else "--decoder-last-pipeline-num-layers"),
                             f"first {first}, last {last}", f"a remainder ({rest}) the middle stages ({mids}) share evenly (transformer_config.py:2294-2368)")
        mid = rest // mids if mids else 0
        lps = tuple([f if f is not None else mid] + [mid] * (pp - 2) + [l_ if l_ is not None else mid])
        for r, n in enumerate(lps):
            if vpp > 1 and n % vpp:
                raise InputError(_src(p, "--num-virtual-stages-per-pipeline-rank"), vpp, f"a divisor of every stage's layers {list(lps)} (transformer_config.py:2331)")
        return vpp, lps, "--decoder-first-pipeline-num-layers" if first else "--decoder-last-pipeline-num-layers", where
    if emb or loss:
        if Lp % pp or (vpp > 1 and (Lp // pp) % vpp):
            raise InputError(_src(p, "--account-for-embedding-in-pipeline-split" if emb else "--account-for-loss-in-pipeline-split"),
                             f"{layers} layers + {int(emb) + int(loss)}", f"a multiple of pp{' x vpp' if vpp > 1 else ''} ({pp * (vpp if vpp > 1 else 1)}) (transformer_config.py:2370-2415)")
        per = Lp // pp
        lps = tuple(per - (int(emb) if r == 0 else 0) - (int(loss) if r == pp - 1 else 0) for r in range(pp)) if pp > 1 else (layers,)
        return vpp, lps, "--account-for-embedding-in-pipeline-split" if emb else "--account-for-loss-in-pipeline-split", where
    if layers % pp:
        raise InputError(f"{p.where}: --num-layers / --pipeline-model-parallel-size", f"{layers} / {pp}",
                         "a whole number of layers per stage, or --decoder-first/last-pipeline-num-layers (arguments.py:985-998)")
    if vpp > 1 and (layers // pp) % vpp:
        raise InputError(where, vpp, f"a divisor of the layers per stage ({layers // pp}) (transformer_block.py:175)")
    return vpp, None, "", where


def _recompute(d: Draft, p: Parsed, t_layers: int) -> None:
    legacy = p.legacy and (p.has("--activations-checkpoint-method") or p.has("--checkpoint-activations"))
    if legacy:
        flag = "--activations-checkpoint-method" if p.has("--activations-checkpoint-method") else "--checkpoint-activations"
        d.set("parallel.recompute", "full", "file", f"{_src(p, flag)} (2021 engine: full recompute)")
        return
    gran = p.one("--recompute-granularity")
    if p.has("--recompute-activations") or p.has("--moe-layer-recompute"):
        gran = gran or "selective"
    if gran == "selective":
        if p.has("--recompute-method"):
            raise InputError(_src(p, "--recompute-method"), p.one("--recompute-method"), "no method with selective recompute (arguments.py:1425)")
        mods = p.many("--recompute-modules") or ["core_attn"]
        if p.has("--moe-layer-recompute"):
            mods = mods + ["moe"]
        flag = "--recompute-granularity" if p.has("--recompute-granularity") else ("--recompute-activations" if p.has("--recompute-activations") else "--moe-layer-recompute")
        d.set("parallel.recompute", "selective", "file", _src(p, flag))
        other = [m for m in mods if m != "core_attn"]
        if other:
            d.unmodelled.append(f"--recompute-modules {' '.join(mods)}: {', '.join(other)} recomputed as well; priced as the planner's "
                                "selective level (core attention only): memory over-estimated, recompute time under-estimated")
        return
    if gran == "full":
        method = p.one("--recompute-method")
        n = p.int("--recompute-num-layers")
        if method is None or n is None:
            raise InputError(_src(p, "--recompute-granularity"), "full", "--recompute-method and --recompute-num-layers beside it (transformer_config.py:1913-1925)")
        d.set("parallel.recompute", "full", "file", _src(p, "--recompute-granularity"))
        if method == "block" and n < t_layers:
            d.unmodelled.append(f"--recompute-method block --recompute-num-layers {n}: {n} of {t_layers} layers per chunk recomputed; priced "
                                "as full recompute of every layer (memory under-estimated, time over-estimated)")
        elif method == "uniform" and n > 1:
            d.notes.append(f"--recompute-method uniform --recompute-num-layers {n}: groups of {n} layers checkpointed; priced per layer")
        return
    d.set("parallel.recompute", "none", "default", "Megatron default: no recompute (no --recompute-granularity)")


def _parallel(d: Draft, p: Parsed) -> None:
    tp = p.int("--tensor-model-parallel-size") or (p.int("--model-parallel-size") if p.legacy else None) or 1
    _set(d, "parallel.tp", tp, p, "--tensor-model-parallel-size", "Megatron default 1")
    pp = p.int("--pipeline-model-parallel-size", 1)
    _set(d, "parallel.pp", pp, p, "--pipeline-model-parallel-size", "Megatron default 1")
    _set(d, "parallel.cp", p.int("--context-parallel-size", 1), p, "--context-parallel-size", "Megatron default 1")
    _set(d, "parallel.ep", p.int("--expert-model-parallel-size", 1), p, "--expert-model-parallel-size", "Megatron default 1")
    _set(d, "parallel.etp", p.int("--expert-tensor-parallel-size") or tp, p, "--expert-tensor-parallel-size",
         "Megatron default: expert tensor parallelism = tp (arguments.py:587)")
    layers = d.get("model.layers") or 0
    vpp, lps, split_flag, vwhere = _split(d, p, layers, pp)
    if vpp > 1:
        d.set("parallel.vpp", vpp, "file", vwhere)
    else:
        d.set("parallel.vpp", 1, "default", "no virtual pipeline stages")
    d.set("parallel.schedule", "interleaved" if vpp > 1 else "1f1b", "default" if vpp == 1 else "file",
          "interleaved 1F1B with virtual stages (schedules.py)" if vpp > 1 else "Megatron: 1F1B")
    if lps is not None:
        d.set("parallel.layers_per_stage", lps, "file", _src(p, split_flag))
    else:
        d.set("parallel.layers_per_stage", tuple([layers // pp] * pp) if layers and pp else None, "default", "even split")
    mb = p.int("--micro-batch-size", p.int("--batch-size") if p.legacy else None)  # >= 1: _positive_ints
    _set(d, "parallel.micro_batch_size", 1 if mb is None else mb, p, "--micro-batch-size", "Megatron default 1")
    sp = p.has("--sequence-parallel") and tp > 1
    _set(d, "parallel.sequence_parallel", sp, p, "--sequence-parallel" if tp > 1 else None,
         "off" if tp > 1 else "off: tensor parallelism is 1 (arguments.py:1433 drops --sequence-parallel)")
    _recompute(d, p, (max(lps) if lps else (layers // max(pp, 1))) // max(vpp, 1))
    _sharding(d, p)
    tpo = p.has("--tp-comm-overlap")
    if tpo and not sp:
        raise InputError(_src(p, "--tp-comm-overlap"), True, "--sequence-parallel with tp > 1 beside it (arguments.py:1441)")
    _set(d, "parallel.tp_comm_overlap", tpo, p, "--tp-comm-overlap", "Megatron default: off (model_parallel_config.py:265)")
    _set(d, "parallel.moe_a2a_overlap", p.has("--overlap-moe-expert-parallel-comm"), p, "--overlap-moe-expert-parallel-comm",
         "Megatron default: off (ModelParallelConfig.overlap_moe_expert_parallel_comm)")
    d.default("parallel.moe_dispatcher", "alltoall", "no MoE dispatcher flag (a dense model, or the all-to-all one)")
    _cuda_graph(d, p)
    if p.legacy:
        d.set("parallel.async_tp_allreduce", False, "default", "2021 engine: blocking TP all-reduces")
    else:
        d.set("parallel.async_tp_allreduce", True, "default",
              "Megatron-core overlaps the backward TP all-reduce with the weight-gradient GEMM (tensor_parallel/layers.py)")
    _attention(d, p)


def _sharding(d: Draft, p: Parsed) -> None:
    dist = p.has("--use-distributed-optimizer")
    ogr, opg = p.has("--overlap-grad-reduce"), p.has("--overlap-param-gather")
    zero, zwhere, kind = (1, _src(p, "--use-distributed-optimizer"), "file") if dist else (0, "Megatron default: DDP, no distributed optimizer", "default")
    if p.legacy and p.has("--DDP-impl"):
        impl = p.one("--DDP-impl")
        ogr = impl == "torch"
        d.set("parallel.overlap_grad_reduce", ogr, "file", f"{_src(p, '--DDP-impl')} {impl}: "
              + ("torch DDP reduces buckets during the backward" if ogr else "local DDP all-reduces after the backward"))
    if p.has("--use-megatron-fsdp"):
        strat = p.one("--data-parallel-sharding-strategy", "optim_grads_params")
        zero = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}[strat]
        zwhere = f"{_src(p, '--use-megatron-fsdp')} strategy {strat}" + ("" if p.has("--data-parallel-sharding-strategy") else " (the default, arguments.py:3190)")
        kind = "file"
        if zero >= 2:
            ogr = True  # forced by Megatron-FSDP (megatron_fsdp.py:331-337)
        if zero == 3:
            opg = True  # forced (megatron_fsdp.py:328-330)
    elif p.has("--use-torch-fsdp2"):
        zero = 2 if p.has("--torch-fsdp2-no-reshard-after-forward") else 3
        zwhere, kind = _src(p, "--use-torch-fsdp2"), "file"
        d.notes.append("--use-torch-fsdp2: priced as the engine's ZeRO-" + str(zero) + " (torch FSDP2 reduce-scatters every micro-batch)")
    if opg and not (ogr and zero >= 1):
        raise InputError(_src(p, "--overlap-param-gather"), True, "--overlap-grad-reduce and a sharded optimizer beside it (arguments.py:1024-1029)")
    d.set("parallel.zero", zero, kind, zwhere)
    if not d.has("parallel.overlap_grad_reduce"):
        _set(d, "parallel.overlap_grad_reduce", ogr, p, "--overlap-grad-reduce" if p.has("--overlap-grad-reduce") else None,
             "Megatron-FSDP forces it on (megatron_fsdp.py:331)" if ogr else "Megatron default: off (arguments.py:3121)")
    _set(d, "parallel.overlap_param_gather", opg, p, "--overlap-param-gather" if p.has("--overlap-param-gather") else None,
         "Megatron-FSDP forces it on (megatron_fsdp.py:328)" if opg else "Megatron default: off (arguments.py:3148)")
    if zero >= 2 and p.has("--use-megatron-fsdp"):
        d.post.append(lambda dd, cluster: _fsdp_prefetch(dd, p, zero, cluster))
    k = p.int("--num-distributed-optimizer-instances", 1)
    if k > 1:
        d.post.append(lambda dd, cluster: _instances(dd, p, k, cluster))  # type: ignore[attr-defined]
    d.set("parallel.zero_shard_degree", None, "default", "the whole data-parallel group")


def _fsdp_prefetch(d: Draft, p: Parsed, zero: int, cluster) -> None:
    """Megatron-FSDP prefetches its own gathers (overlap_param_gather forced on for
    optim_grads_params, megatron_fsdp.py:328-330); which gathers that hides is the engine
    profile's sharding mode (per-layer gathers are priced by the mode, the switch covers
    once-per-step ones)."""
    from planner.engines import engine_flags, get_engine  # noqa: PLC0415

    tp, pp = d.get("parallel.tp", 1), d.get("parallel.pp", 1)
    given = {"overlap_grad_reduce": True}
    if p.has("--overlap-param-gather") and zero == 2:  # optim_grads_params forces it whatever the flag
        given["overlap_param_gather"] = True
    opg = engine_flags(get_engine(d.engine), cluster.gpu, tp, zero, given, pp, cluster.nvlink_domain)["overlap_param_gather"]
    d.set("parallel.overlap_param_gather", opg, "default", "Megatron-FSDP's own prefetch (megatron_fsdp.py:328-330), as the engine "
          f"profile's ZeRO-{zero} mode prices it")


def _instances(d: Draft, p: Parsed, k: int, cluster) -> None:
    tp, pp, cp = d.get("parallel.tp", 1), d.get("parallel.pp", 1), d.get("parallel.cp", 1)
    dp = cluster.num_gpus // (tp * pp * cp)
    if (dp * cp) % k:
        raise InputError(_src(p, "--num-distributed-optimizer-instances"), k, f"a divisor of dp x cp ({dp * cp}) (parallel_state.py:922)")
    d.set("parallel.zero_shard_degree", dp * cp // k, "file", _src(p, "--num-distributed-optimizer-instances"))


def _attention(d: Draft, p: Parsed) -> None:
    backend = p.one("--attention-backend", "auto")
    local = p.one("--transformer-impl") == "local" or (p.many("--spec") or [""])[0] == "local"
    if p.legacy:
        d.set("parallel.attention", "unfused", "default", "2021 engine: fused scale-mask-softmax over the full square")
        return
    if backend in ("unfused", "local") or (local and not p.has("--use-flash-attn")):
        d.set("parallel.attention", "unfused", "file", _src(p, "--attention-backend" if p.has("--attention-backend") else
                                                                  ("--transformer-impl" if p.has("--transformer-impl") else "--spec")))
        return
    flag = "--attention-backend" if p.has("--attention-backend") else ("--use-flash-attn" if p.has("--use-flash-attn") else None)

    def by_gpu(dd: Draft, cluster) -> None:
        ok = supports_flash(cluster.gpu)
        where = (_src(p, flag) if flag else "Megatron default --attention-backend auto") + ("" if ok else f" (no flash kernel on {cluster.gpu.id})")
        kind = "flash" if ok else "unfused"
        kernels = get_engine(dd.engine).attention_kernels if dd.engine else ()
        if ok and kernels and "flash" not in kernels:  # an engine whose flag runs the flash-attn 2 package (the ZB fork)
            kind = "fa2" if flag and "fa2" in kernels else "unfused"
        dd.set("parallel.attention", kind, "file" if flag else "default", where)

    d.post.append(by_gpu)  # type: ignore[attr-defined]
