"""Runs INSIDE an engine's environment (made by scripts/check_engines.py): loads draftsmith exports with the
engine's own config readers, draft-model classes and `load_weights`, and runs one teacher-forced draft step.

    ENGINE_PYTHON scripts/engine_worker.py JOB.json

JOB.json: {"engine": "vllm"|"sglang"|"speculators", "target": DIR, "inputs": FILE.pt, "out": FILE.pt,
"cases": [{"name", "format", "method", "folder"}]}. FILE.pt (inputs) holds `input_ids` (T,) of a prompt.
The result FILE.pt maps each case name to {"status": "loaded", "logits" (T, V) over the target vocabulary,
"token_ids" (T,) target ids, "hidden" (T, h) the state the engine feeds back} or {"status": "failed",
"error": one line}. Nothing here imports draftsmith: the engine's code is the only reader.

Stand-ins, only for what cannot run on a CPU: vLLM's paged `Attention` (a CUDA/paged-KV kernel) is replaced by
plain causal attention over the step's tokens (`CausalAttention`); the distributed groups are vLLM's own,
initialized for one process on gloo; the proposer's sharing of the target's embeddings / lm_head is done here
as vLLM's EAGLE proposer does it; custom ops run their `forward_native` (no CUDA kernels). SGLang: see
`run_sglang` (its modules cannot be imported on this CPU: the fallback reads its installed source).
"""
from __future__ import annotations

import glob
import json
import os
import sys
import traceback

import torch
import torch.nn.functional as F


def one_line(err: BaseException) -> str:
    lines = [line.strip() for line in f"{type(err).__name__}: {err}".strip().splitlines() if line.strip()]
    return " ".join(lines[:3])[:400] if lines else type(err).__name__


class CausalAttention(torch.nn.Module):
    """Stands in for vLLM's paged Attention: causal attention over the tokens of one step, (T, H*D) in and out."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, *args, **kwargs):
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads

    def forward(self, query, key, value, *args, **kwargs):
        T = query.shape[0]
        q = query.view(T, self.num_heads, self.head_size).transpose(0, 1)  # (H, T, D)
        rep = self.num_heads // self.num_kv_heads
        k = key.view(T, self.num_kv_heads, self.head_size).transpose(0, 1).repeat_interleave(rep, 0)
        v = value.view(T, self.num_kv_heads, self.head_size).transpose(0, 1).repeat_interleave(rep, 0)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)  # (H, T, D)
        return out.transpose(0, 1).reshape(T, self.num_heads * self.head_size)


# ------------------------------------------------------------------------------------------------- vLLM

def _vllm_setup():
    import vllm.model_executor.models.llama as llama

    llama.Attention = CausalAttention  # the one stand-in: paged attention needs a GPU and a block table
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    return init_distributed_environment, initialize_model_parallel


def _vllm_config(target: str, case: dict, k: int = 3):
    from vllm.config import (CompilationConfig, DeviceConfig, ModelConfig, ParallelConfig, SpeculativeConfig,
                             VllmConfig)

    model_config = ModelConfig(model=target, tokenizer=target, dtype="float32", max_model_len=64, enforce_eager=True,
                               skip_tokenizer_init=True)
    parallel = ParallelConfig()
    method = {"eagle1": "eagle", "eagle3": "eagle3", "medusa": "medusa"}[case["method"]]
    speculative = SpeculativeConfig(model=case["folder"], method=method, num_speculative_tokens=k,
                                    target_model_config=model_config, target_parallel_config=parallel)
    return VllmConfig(model_config=model_config, speculative_config=speculative, parallel_config=parallel,
                      device_config=DeviceConfig(device="cpu"), compilation_config=CompilationConfig(mode=0, custom_ops=["none"]))  # forward_native


def _vllm_model(vllm_config, model_config, folder: str | None):
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
    from vllm.model_executor.models.registry import ModelRegistry

    cls, _ = ModelRegistry.resolve_model_cls(model_config.architectures, model_config=model_config)
    model = cls(vllm_config=vllm_config, prefix="").eval()
    files = sorted(glob.glob(os.path.join(folder or model_config.model, "*.safetensors")))
    model.load_weights(safetensors_weights_iterator(files, use_tqdm_on_load=False))
    return model


@torch.no_grad()
def run_vllm(job: dict) -> dict:
    from vllm.config import set_current_vllm_config

    init_env, init_parallel = _vllm_setup()
    ids = torch.load(job["inputs"])["input_ids"]
    T = ids.numel()
    positions = torch.arange(T)
    next_ids = torch.cat([ids[1:], ids[-1:]])  # teacher forcing: the draft at t reads token t+1
    results, initialized = {}, False
    for case in job["cases"]:
        try:
            vllm_config = _vllm_config(job["target"], case)
            with set_current_vllm_config(vllm_config):
                if not initialized:
                    init_env(world_size=1, rank=0, local_rank=0, backend="gloo",
                             distributed_init_method=f"tcp://127.0.0.1:{29500 + os.getpid() % 1000}")
                    init_parallel(1, 1)
                    initialized = True
                target = _vllm_model(vllm_config, vllm_config.model_config, None)
                draft_config = vllm_config.speculative_config.draft_model_config
                draft = _vllm_model(vllm_config, draft_config, case["folder"])
                results[case["name"]] = _vllm_step(case["method"], target, draft, draft_config.hf_config, ids,
                                                   next_ids, positions, shares_embeddings=not _stores_embeddings(
                                                       case["folder"]))
                if case["format"] == "speculators":
                    results[case["name"]]["serve_dir"] = _serve_dir(case["folder"])
        except Exception as err:  # the engine's own error is the result
            results[case["name"]] = {"status": "failed", "error": one_line(err),
                                     "trace": traceback.format_exc(limit=-3)}
    return results


def _vllm_step(method, target, draft, hf_config, ids, next_ids, positions, *, shares_embeddings: bool) -> dict:
    if method == "eagle3":
        layer_ids = getattr(hf_config, "eagle_aux_hidden_state_layer_ids", None) or \
            (getattr(hf_config, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")
        if not layer_ids:  # gpu_model_runner's default when the draft config names none
            layer_ids = target.get_eagle3_default_aux_hidden_state_layers()
        target.set_aux_hidden_state_layers(tuple(int(i) for i in layer_ids))
    out = target.model(ids, positions, None)  # (input_ids, positions, intermediate_tensors)
    hidden, aux = (out if isinstance(out, tuple) else (out, None))
    if shares_embeddings and method != "medusa":  # the EAGLE proposer shares the target's embeddings then
        draft.model.embed_tokens = target.model.embed_tokens
    if method == "medusa":
        blocks = draft(hidden)
        logits = torch.stack(draft.compute_logits(blocks))  # (heads, T, V)
        return {"status": "loaded", "logits": logits.float(), "token_ids": logits.argmax(-1),
                "hidden": torch.stack(blocks).float()}
    if method == "eagle1":
        draft.lm_head = target.lm_head  # EagleLlamaForCausalLM has no lm_head: the proposer shares the target's
        features = hidden
    else:
        features = draft.combine_hidden_states(torch.cat(aux, dim=-1))
    draft_out = draft(next_ids, positions, features)
    normed, fed_back = draft_out if isinstance(draft_out, tuple) else (draft_out, draft_out)
    logits = draft.compute_logits(normed).float()  # (T, V): draft ids already mapped to target ids by vLLM
    return {"status": "loaded", "logits": logits, "token_ids": logits.argmax(-1), "hidden": fed_back.float()}


def _serve_dir(folder: str) -> str:
    """What `vllm serve OUT` does first with a speculators folder: resolve the verifier named inside it."""
    from vllm.transformers_utils.config import maybe_override_with_speculators

    try:
        model, _, _ = maybe_override_with_speculators(folder, None, False)
    except Exception as err:  # noqa: BLE001 (vLLM's refusal is the result)
        return f"refused ({one_line(err)})"
    return f"serves the verifier {model}"


def _stores_embeddings(folder: str) -> bool:
    from safetensors import safe_open

    for path in glob.glob(os.path.join(folder, "*.safetensors")):
        with safe_open(path, "pt") as f:
            if any("embed_tokens" in name for name in f.keys()):
                return True
    return False


# -------------------------------------------------------------------------------------------- speculators

@torch.no_grad()
def run_speculators(job: dict) -> dict:
    """speculators' own config class and Eagle3DraftModel (its first-layer class, its norms, its fc)."""
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel
    from transformers import AutoModelForCausalLM

    ids = torch.load(job["inputs"])["input_ids"]
    T = ids.numel()
    next_ids = torch.cat([ids[1:], ids[-1:]])
    target = AutoModelForCausalLM.from_pretrained(job["target"], dtype=torch.float32).eval()
    hidden_states = target(ids[None], output_hidden_states=True).hidden_states
    results = {}
    for case in job["cases"]:
        try:
            config = SpeculatorModelConfig.from_pretrained(case["folder"])
            config.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex attention
            config.speculators_config.verifier.name_or_path = job["target"]  # this machine's copy of the target
            model = Eagle3DraftModel.from_pretrained(case["folder"], config=config).eval()
            model._load_verifier_weights(overwrite_embed_tokens=True)  # noqa: SLF001
            layers = list(model.config.eagle_aux_hidden_state_layer_ids)  # speculators: input of layer i
            aux = torch.cat([hidden_states[i][0] for i in layers], dim=-1)  # (T, 3h)
            if model.input_norm is not None:
                aux = model.input_norm(aux)
            fused = model.fc(aux)
            x = torch.cat([model.embed_tokens(next_ids), fused], dim=-1)[None]  # (1, T, 2h)
            positions = torch.arange(T)[None]
            mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
            out = model.layers[0](x, attention_mask=mask, position_ids=positions,
                                  position_embeddings=model.rotary_emb(x, positions))
            out = out[0] if isinstance(out, tuple) else out
            logits = model.lm_head(model.norm(out))[0].float()  # (T, Vd)
            d2t = getattr(model, "d2t", None)
            draft_ids = logits.argmax(-1)
            token_ids = draft_ids + d2t[draft_ids] if d2t is not None else draft_ids
            results[case["name"]] = {"status": "loaded", "logits": logits, "token_ids": token_ids,
                                     "hidden": out[0].float(), "draft_vocab": True}
        except Exception as err:
            results[case["name"]] = {"status": "failed", "error": one_line(err),
                                     "trace": traceback.format_exc(limit=-3)}
    return results


# ------------------------------------------------------------------------------------------------ SGLang

SGLANG_MODULES = {"eagle1": "sglang.srt.models.llama_eagle", "eagle3": "sglang.srt.models.llama_eagle3"}


def run_sglang(job: dict) -> dict:
    """SGLang's EAGLE modules import CUDA kernels and a torchvision built for its pinned torch; when they cannot
    be imported here, fall back to their installed SOURCE: the config keys they read (`getattr(config, KEY)`,
    `eagle_config.get(KEY)`), which the export must carry, since a missing one takes SGLang's default."""
    import importlib

    results = {}
    for case in job["cases"]:
        module = SGLANG_MODULES[case["method"]]
        try:
            importlib.import_module(module)
            error = None
        except Exception as err:  # noqa: BLE001 (the reason it cannot be built here is the result)
            error = one_line(err)
        keys = _source_config_keys(module)
        config = json.loads(open(os.path.join(case["folder"], "config.json")).read())
        present = set(config) | set(config.get("eagle_config") or {})
        missing = sorted(k for k in keys if k not in present)
        results[case["name"]] = {"status": "source", "module": module, "error": error or "imported (not run)",
                                 "keys": sorted(keys), "missing": missing}
    return results


def _source_config_keys(module: str) -> set[str]:
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    tree = ast.parse(open(spec.origin).read())
    keys = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and True:
            func = node.func
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            args = node.args
            if name == "getattr" and len(args) >= 2 and getattr(args[0], "id", "") == "config" \
                    and isinstance(args[1], ast.Constant):
                keys.add(args[1].value)
            if name == "get" and isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "eagle_config" \
                    and isinstance(args[0], ast.Constant):
                keys.add(args[0].value)
    return keys


RUNNERS = {"vllm": run_vllm, "speculators": run_speculators, "sglang": run_sglang}


def main() -> int:
    job = json.loads(open(sys.argv[1]).read())
    results = RUNNERS[job["engine"]](job)
    torch.save(results, job["out"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
