"""Loading a target: an HF folder, a hub id, a GGUF file, or `demo` (the cached default)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftsmith.serve.core.attention import use_cpu_gqa
from draftsmith.serve.core.errors import TargetError
from draftsmith.serve.core.identity import config_hash, tokenizer_hash
from draftsmith.serve.core.invariant import apply_invariance
from draftsmith.serve.core.head_input import standard_head_input
from draftsmith.serve.core.packed import pack_linears, packing_wanted, remember_setting, tune_small_rows
from draftsmith.serve.core.target_config import DTYPE_NAMES, TargetConfig, text_config
from draftsmith.serve.core.families import family_of, loadable_model_types

__all__ = ["DTYPES", "SUPPORTED_MODEL_TYPES", "Target", "TargetError", "eos_token_ids", "load_configured", "load_target",
           "text_config"]

# Target families our tests cover (serve/core/families.py; the drafters' own layer is a Llama layer for every one)
SUPPORTED_MODEL_TYPES = loadable_model_types()

_SHORT = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DTYPES = {name: getattr(torch, _SHORT.get(name, name)) for name in DTYPE_NAMES}  # what TargetConfig.dtype accepts


@dataclass
class Target:
    model: Any  # a transformers *ForCausalLM, in eval mode, frozen
    tokenizer: Any  # None for a target known by its config alone (Target.of_config)
    name: str  # what the user passed (or the hub name of the demo target)
    path: str  # where the weights were read from
    sharded: Any = None  # draftsmith.serve.core.sharded_target.ShardedForward when the model is split over processes

    @property
    def config(self):
        return self.model.config

    @property
    def config_hash(self) -> str:
        return config_hash(self.model.config)

    @property
    def tokenizer_hash(self) -> str:
        return tokenizer_hash(self.tokenizer) if self.tokenizer is not None else ""

    @property
    def num_layers(self) -> int:
        return text_config(self.model.config).num_hidden_layers

    @property
    def eos_token_ids(self) -> list[int]:
        return eos_token_ids(self.model, self.tokenizer)

    @classmethod
    def of_config(cls, config: Any, *, name: str) -> "Target":
        """A target known by its config alone, before any file is read (`train --plan` sizes the head it would
        train): no weights, no tokenizer, an empty tokenizer hash."""
        return cls(model=WeightlessModel(config), tokenizer=None, name=name, path="")


class WeightlessModel:
    """What a Target without weights keeps of its model: the config and the generation config."""

    def __init__(self, config: Any, path: str | None = None, kwargs: dict[str, Any] | None = None):
        from transformers import GenerationConfig

        self.config = config
        try:
            if path is None:
                raise OSError("no folder")
            self.generation_config = GenerationConfig.from_pretrained(path, **(kwargs or {}))
        except OSError:  # no generation_config.json: the model config's defaults, as from_pretrained does
            self.generation_config = GenerationConfig.from_model_config(config)


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and int(v) not in ids:
                ids.append(int(v))
    return ids


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise TargetError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def check_dtype_runs(dtype: torch.dtype, device: str) -> None:
    """TargetError when `device` cannot multiply matrices in `dtype` (bfloat16 on a GPU older than Ampere, a CPU
    build without half-precision kernels), before the target is loaded."""
    try:
        probe = torch.ones(2, 8, dtype=dtype, device=device)
        torch.nn.functional.linear(probe, probe)
    except (RuntimeError, TypeError) as err:
        raise TargetError(f"{device} cannot compute in {dtype}: {str(err).splitlines()[0][:160]}; use "
                          f"target.dtype=float32") from None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "tiktoken.model")
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


def check_model_folder(folder: Path, *, weights: bool) -> None:
    """TargetError naming what a save_pretrained folder lacks (its tokenizer, or its weights when they are loaded),
    before transformers fails on it with a message about missing packages."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise TargetError(f"{folder} has config.json but no tokenizer (none of {', '.join(TOKENIZER_FILES)}): save "
                          f"the tokenizer beside the model (`tokenizer.save_pretrained({str(folder)!r})`) or copy "
                          f"its files from the model you fine-tuned from")
    if weights and not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise TargetError(f"{folder} has config.json but no weights (no *.safetensors or *.bin): save the model with "
                          f"`model.save_pretrained({str(folder)!r})`, or finish copying it")


def check_text_model(config: Any, folder: Path | None, spec: str) -> None:
    """TargetError when a vision-language config (one that nests a text model) was saved without its
    `text_config`: transformers would build its default text model, and the weights would not fit it."""
    if folder is None or config.get_text_config() is config:
        return
    saved = json.loads((folder / "config.json").read_text())
    if saved.get("model_type") == config.model_type and "text_config" not in saved:
        raise TargetError(f"{spec!r} is a {config.model_type!r} vision-language config without its `text_config` "
                          f"(the text model's sizes): copy it from the model you fine-tuned from into config.json")


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def load_target(spec: str | Path, *, dtype: str | torch.dtype = "float32", device: str = "cpu",
                require_chat_template: bool = False, cache_dir: str | None = None, weights: bool = True,
                packed_weights: str = "auto", invariant: str = "auto", layout: Any = None,
                top1: bool = False) -> Target:
    """Load a frozen target and its tokenizer from `spec`.

    `spec` is `demo` / `demo:<name>` (the embedded default targets, built on first use), a folder
    written by `save_pretrained`, a `.gguf` file, or a hub id (needs the network). `weights=False` loads
    the config, generation config and tokenizer only (a server generates; the identity hashes still work).
    `packed_weights` (auto | on | off): CPU forwards over several tokens through oneDNN's packed linear
    (serve/core/packed.py). `invariant` (auto | on | off): batch-invariant forwards, so that a token's logits do
    not depend on how many tokens or rows are computed with it (serve/core/invariant.py; auto: bfloat16 and
    float16). `layout` (a sharded draftsmith.serve.core.parallel_layout.Layout, inside a started process
    group): every process loads only its shards, and the target forwards through `Target.sharded`
    (serve/core/sharded_target.py; `top1`: its lock-step forwards also return the lm_head's argmax).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _resolve_dtype(dtype)
    check_dtype_runs(torch_dtype, device)
    spec = str(spec)
    kwargs: dict[str, Any] = {}
    if spec == "demo" or spec.startswith("demo:"):
        from draftsmith.serve.core.demo_target import DEFAULT_MODEL, DEMO_MODELS, fetch_demo

        name = spec.split(":", 1)[1] if ":" in spec else DEFAULT_MODEL
        path = str(fetch_demo(name, cache_dir=cache_dir))
        display = DEMO_MODELS[name].hf_name
    elif spec.endswith(".gguf"):
        gguf = Path(spec)
        if not gguf.is_file():
            raise TargetError(f"GGUF file not found: {gguf}")
        path, display = str(gguf.parent), spec
        kwargs["gguf_file"] = gguf.name
    else:
        local = Path(spec)
        if local.exists():
            if not (local / "config.json").is_file():
                raise TargetError(f"{local} is not a model folder: no config.json (expected a folder written "
                                  f"by save_pretrained, a .gguf file, a hub id, or `demo`)")
        elif spec.startswith((".", "/", "~")) or spec.count("/") > 1:
            raise TargetError(f"target path not found: {spec}")
        path, display = spec, spec
        if local.is_dir():
            check_model_folder(local, weights=weights)
    try:
        config = AutoConfig.from_pretrained(path, **kwargs)
    except OSError as err:
        raise TargetError(f"could not load a model config from {spec!r}: {str(err).splitlines()[0]} "
                          f"(offline? use a local folder, a .gguf file or `demo`)") from None
    except (ValueError, KeyError) as err:  # a model_type this transformers does not know
        raise TargetError(f"transformers {_transformers_version()} cannot build the model in {spec!r}: "
                          f"{str(err).splitlines()[0][:200]} (a newer transformers, or a supported family: "
                          f"{', '.join(SUPPORTED_MODEL_TYPES)})") from None
    except Exception as err:  # noqa: BLE001  huggingface_hub's strict config validation (not a ValueError)
        if not type(err).__name__.startswith("StrictDataclass"):
            raise
        cause = err.__cause__ or err
        raise TargetError(f"the config in {spec!r} is inconsistent: {str(cause).splitlines()[0][:200]} (fix "
                          f"config.json)") from None
    check_text_model(config, Path(path) if Path(path).is_dir() else None, spec)
    model_type = getattr(text_config(config), "model_type", None) or config.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        refused = getattr(family_of(model_type), "refused", None)
        if refused:
            raise TargetError(f"{spec!r} is a {model_type!r} model, which draftsmith does not load: {refused}")
        raise TargetError(f"{spec!r} is a {model_type!r} model; draftsmith supports "
                          f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    if require_chat_template and not getattr(tokenizer, "chat_template", None):
        raise TargetError(f"{spec!r} has no chat template but a chat dataset/--chat was asked for; use "
                          f"plain prompts (no --chat) or a tokenizer that has one")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not weights:
        return Target(model=WeightlessModel(config, path, kwargs), tokenizer=tokenizer, name=display, path=path)
    if layout is not None and layout.sharded:
        return _load_sharded(path, display, tokenizer, config, torch_dtype, device, layout, top1, kwargs)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **kwargs)
    if getattr(model, "hf_quantizer", None) is not None and "gguf_file" in kwargs:
        model.hf_quantizer.remove_quantization_config(model)
    model.to(device).eval().requires_grad_(False)
    use_cpu_gqa(model)  # forwards over several tokens attend grouped heads without copying the cache (serve/core/attention.py)
    standard_head_input(model)  # a prefill's last-token logits without a copy of the lm_head's weight per row
    remember_setting(model, packed_weights)  # bf16 forwards inside `suspended` read it (serve/core/packed.py)
    if apply_invariance(model, invariant):
        return Target(model=model, tokenizer=tokenizer, name=display, path=path)
    if packing_wanted(model, packed_weights):
        pack_linears(model)
        tune_small_rows(model)  # which kernel forwards over 1 to 3 tokens run fastest on, on this CPU
    return Target(model=model, tokenizer=tokenizer, name=display, path=path)


def _load_sharded(path: str, display: str, tokenizer: Any, config: Any, dtype: torch.dtype, device: str, layout: Any,
                  top1: bool, kwargs: dict[str, Any]) -> Target:
    from draftsmith.serve.core.process_group import launch
    from draftsmith.serve.core.sharded_target import ShardedForward, load_sharded_model

    if "gguf_file" in kwargs:
        raise TargetError("a GGUF target cannot be loaded sharded (target.parallel): convert it to a safetensors "
                          "folder (save_pretrained) first")
    here = launch()
    model = load_sharded_model(path, dtype=dtype, layout=layout, config=config, **kwargs)
    model.eval().requires_grad_(False)
    on_gpu = torch.device(device).type == "cuda"
    compute = torch.device("cuda", here.local_rank) if on_gpu else torch.device("cpu")
    forward = ShardedForward(model, layout, rank=here.rank, device=compute, comm_device=compute, top1=top1)
    return Target(model=model, tokenizer=tokenizer, name=display, path=path, sharded=forward)


def load_configured(config: TargetConfig, **kwargs: Any) -> Target:
    """The target a `target` config section names: load_target(spec) in its dtype (auto: float32) on its device;
    `kwargs` go to load_target."""
    config.validate()
    if config.parallel not in ("none", "auto"):
        raise TargetError(f"target.parallel={config.parallel} splits the target for `data capture` and `train` "
                          f"only; this command runs it whole on one device (for self-distillation of a large "
                          f"target use `data build --server URL` with your serving engine)")
    dtype = "float32" if config.dtype == "auto" else config.dtype
    kwargs.setdefault("packed_weights", config.packed_weights)
    kwargs.setdefault("invariant", config.invariant)
    return load_target(config.spec, dtype=dtype, device=config.resolved_device(), **kwargs)
