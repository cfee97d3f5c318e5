"""torchtitan ``model.name`` / ``model.flavor`` -> the model's shape, read from the installed
torchtitan 0.2.2: the flavor's args from its registry (``get_train_spec(name).model_args``,
torchtitan/protocols/train_spec.py:71-89), the model built on the meta device with the layers
it needs to show every kind of block (one dense, one MoE), and the shape read off the
parameters (``tok_embeddings``, ``attention.wq``/``wkv_a``/``wkv_b``, ``feed_forward.w1``,
``moe.experts.w1``, ``moe.shared_experts.w1``, ``output``). Nothing is tabulated here.

torchtitan 0.2.2 imports triton kernels at import time (torchtitan/models/moe/kernels.py:8);
on a machine without triton only that torchtitan module is replaced by a stand-in that raises
if called (the notes' workaround, docs/research/titan_deepspeed.md sec. 0): building on the meta
device never calls it.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import types
from functools import lru_cache

from planner.errors import InputError

__all__ = ["flavor_shape", "flavors_of", "titan_available"]


def _stub_triton_kernels() -> None:
    try:
        import triton  # noqa: F401,PLC0415
        return
    except ImportError:
        pass
    name = "torchtitan.models.moe.kernels"
    if name in sys.modules:
        return
    mod = types.ModuleType(name)

    def unavailable(*a, **k):
        raise RuntimeError("torchtitan's triton kernels are not available on this machine")

    mod.generate_permute_indices = mod.fill_indices_wrapper = unavailable
    mod.__all__ = ["generate_permute_indices", "fill_indices_wrapper"]
    sys.modules[name] = mod


def titan_available() -> bool:
    import importlib.util  # noqa: PLC0415

    return importlib.util.find_spec("torchtitan") is not None


def _spec(name: str):
    if not titan_available():
        raise InputError("model.name", name, "a torchtitan model: install torchtitan 0.2.2 to resolve model.name/model.flavor")
    _stub_triton_kernels()
    from torchtitan.protocols.train_spec import get_train_spec  # noqa: PLC0415

    try:
        return get_train_spec(name)
    except (ValueError, KeyError, ImportError, AttributeError) as exc:
        raise InputError("model.name", name, f"a model torchtitan 0.2.2 registers ({exc})") from None


def flavors_of(name: str) -> list[str]:
    return sorted(_spec(name).model_args)


# Importing torchtitan's model registry takes seconds (it imports torch, torch.distributed and
# its dataset code); the shapes it gives depend only on the installed torchtitan, so they are kept
# in a small JSON file per torchtitan version in the user's cache folder ($PLANNER_CACHE_DIR, else
# $XDG_CACHE_HOME/planner, else ~/.cache/planner). A file that cannot be read or written is
# ignored: the shape is then read from torchtitan as before. The file is per planner version too,
# and _CACHE_FORMAT changes with the reading.
_CACHE_FORMAT = 1


def _cache_file():
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    try:
        ver = version("torchtitan")
    except PackageNotFoundError:
        return None
    root = os.environ.get("PLANNER_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "planner")
    from planner import __version__  # noqa: PLC0415

    return Path(root) / f"torchtitan-{ver}-flavors-planner-{__version__}-v{_CACHE_FORMAT}.json"


@lru_cache(maxsize=64)
def flavor_shape(name: str, flavor: str, seq_len: int = 4096) -> dict:
    """The ModelSpec fields of the installed torchtitan's ``name``/``flavor`` (and, for MoE
    flavors, their dense layers), from the cache file when it holds them."""
    import json  # noqa: PLC0415

    path, key = _cache_file(), f"{name}/{flavor}/{seq_len}"
    cached: dict = {}
    if path is not None:
        try:
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            cached = {}
        if isinstance(cached, dict) and isinstance(cached.get(key), dict):
            return cached[key]
    out = _read_flavor(name, flavor, seq_len)
    if path is not None:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({**(cached if isinstance(cached, dict) else {}), key: out}, sort_keys=True))
            tmp.replace(path)  # atomic: a concurrent reader sees the old file or the new one
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)  # no half-written file left behind
    return out


def _read_flavor(name: str, flavor: str, seq_len: int) -> dict:
    """The shape of ``name``/``flavor`` read from torchtitan (its registry and a meta-device model)."""
    spec = _spec(name)
    if flavor not in spec.model_args:
        raise InputError("model.flavor", flavor, f"a flavor of {name} in torchtitan 0.2.2 ({', '.join(sorted(spec.model_args))})")
    import torch  # noqa: PLC0415
    from torchtitan.config.job_config import JobConfig  # noqa: PLC0415

    args = copy.deepcopy(spec.model_args[flavor])
    jc = JobConfig()
    jc.training.seq_len = seq_len
    if hasattr(args, "update_from_config"):
        try:
            args.update_from_config(jc)
        except Exception:  # noqa: BLE001  (a flavor that needs GPU features; its shape does not depend on them)
            pass
    layers = int(args.n_layers)
    n_dense = int(getattr(args, "n_dense_layers", 0) or 0)
    step = int(getattr(args, "interleave_moe_layer_step", 1) or 1)
    moe_enabled = getattr(args, "moe_args", None) is not None and getattr(args, "moe_enabled", True)
    build = min(layers, max(1, n_dense + 1 if moe_enabled else 1, step if moe_enabled else 1))
    args.n_layers = build
    with torch.device("meta"):
        model = spec.model_cls(args)
    params = dict(model.named_parameters())
    out: dict = {"layers": layers, "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "position_embedding": "rope"}
    emb = params["tok_embeddings.weight"]
    out["vocab"], out["hidden"] = int(emb.shape[0]), int(emb.shape[1])
    out["tied_embeddings"] = "output.weight" not in params or params["output.weight"] is emb
    heads = int(args.n_heads)
    out["heads"] = heads
    out["rope_theta"] = float(getattr(args, "rope_theta", 10000.0))
    if "layers.0.attention.wkv_a.weight" in params:  # multi-head latent attention
        out["kv_heads"] = heads
        out["kv_lora_rank"] = int(args.kv_lora_rank)
        out["q_lora_rank"] = int(args.q_lora_rank or 0)
        out["qk_rope_head_dim"] = int(args.qk_rope_head_dim)
        out["head_dim"] = int(args.qk_nope_head_dim)
        out["v_head_dim"] = int(args.v_head_dim)
    else:
        wq, wk = params["layers.0.attention.wq.weight"], params["layers.0.attention.wk.weight"]
        hd = int(wq.shape[0]) // heads
        out["head_dim"], out["kv_heads"] = hd, int(wk.shape[0]) // hd
    dense_pattern = []
    for i in range(build):
        dense_pattern.append(f"layers.{i}.feed_forward.w1.weight" in params)
    ffn = next((int(params[f"layers.{i}.feed_forward.w1.weight"].shape[0]) for i in range(build) if dense_pattern[i]), None)
    if moe_enabled and not all(dense_pattern):
        k = next(i for i in range(build) if not dense_pattern[i])
        ew = params[f"layers.{k}.moe.experts.w1"]
        experts, eff = int(ew.shape[0]), int(ew.shape[1])
        shared_w = params.get(f"layers.{k}.moe.shared_experts.w1.weight")
        shared = int(shared_w.shape[0]) // eff if shared_w is not None else 0
        if n_dense:
            dense = n_dense
        elif step > 1:
            dense = layers - len(range(step - 1, layers, step))
        else:
            dense = 0
        out["moe"] = {"experts": experts, "top_k": int(args.moe_args.top_k), "expert_ffn_hidden": eff, "shared_experts": shared,
                      "dense_layers": dense}
        out["interleaved_moe"] = step > 1
    out["ffn_hidden"] = ffn if ffn is not None else out.get("moe", {}).get("expert_ffn_hidden")
    return out
