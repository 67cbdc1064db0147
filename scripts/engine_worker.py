"""Runs INSIDE an engine's environment (made by scripts/check_engines.py): loads draftsmith exports with the
engine's own config readers, draft-model classes and `load_weights`, and runs one teacher-forced draft step.

    ENGINE_PYTHON scripts/engine_worker.py JOB.json

JOB.json: {"engine": "vllm"|"sglang"|"speculators", "inputs": FILE.pt, "out": FILE.pt,
"cases": [{"name", "family", "target": DIR, "format", "method", "folder", "merged"}]}; "merged": the folder is a
copy of the target's checkpoint with the draft layer in it (MTP: the engine serves that folder as the target and
drafts with the layer it finds there, vLLM `method: mtp`, SGLang NEXTN). FILE.pt (inputs) holds `input_ids`
(T,) of a prompt. The result FILE.pt maps each case name to {"status": "loaded", "logits" (T, V) over the target
vocabulary, "token_ids" (T,) target ids, "hidden" (T, h) the state the engine feeds back, and "target_states"
when the target's hidden states came from transformers rather than the engine's target class, "reads": what the
engine mapped the folder to, for a merged one} or
{"status": "failed", "error": one line}. Nothing here imports draftsmith: the engine's code is the only reader.

Stand-ins, only for what cannot run on a CPU: vLLM's paged `Attention` (a CUDA/paged-KV kernel) is replaced, in
every vLLM model module the target and draft classes use, by plain causal attention over the step's tokens
(`CausalAttention`, with gpt-oss's sinks and sliding windows); the distributed groups are vLLM's own,
initialized for one process on gloo; the target's embeddings / lm_head are shared with the draft by vLLM's own
proposer helpers (`maybe_share_target_embed`, `share_target_lm_head`; by hand as they do where a release lacks
them); custom ops run their `forward_native` (no CUDA kernels); fused-MoE layers (Qwen3-MoE, gpt-oss, the MTP
layers of Qwen3-Next, Qwen3.5-MoE, DeepSeek-V3, GLM-4.5 and Nemotron-H) keep vLLM's router (the one it builds on a
CPU), weights, weight loaders and shared experts, and only the routed experts' grouped GEMM runs in torch
(`NativeExperts`, which also runs the experts without a gate that vLLM's MoE config refuses on a CPU); vLLM's
latent attention (DeepSeek's MLA, whose backends need a GPU) keeps vLLM's projections, norms and RoPE, and only the
attention over the latent runs in torch (`LatentAttention`); the target's lm_head is also put in each MTP layer's
`shared_head.head`, as vLLM's proposer does; torchvision, which vLLM's Qwen3.5 module imports for its vision
processors and a text model never calls, is an importable stand-in where the project's torch
has no build of it (`ABSENT_TORCHVISION`). Where the engine's target class still cannot be built or run on a CPU,
the hidden states come from the transformers target and the verdict says so; the engine's draft class and
`load_weights` still load and run the export. An MTP layer that zeroes the token embedding at position 0 (vLLM's
DeepSeek and GLM ones; our head does not) is compared at positions 1..T, its step from 0 reported beside it
(`_zeroes_position_zero`). SGLang: see `run_sglang` (its modules cannot be imported on this CPU: the fallback reads
its installed source).
"""
from __future__ import annotations

import glob
import inspect
import json
import os
import re
import sys
import textwrap
import traceback

import torch


def one_line(err: BaseException) -> str:
    lines = [line.strip() for line in f"{type(err).__name__}: {err}".strip().splitlines() if line.strip()]
    return " ".join(lines[:3])[:400] if lines else type(err).__name__


class CausalAttention(torch.nn.Module):
    """Stands in for vLLM's paged Attention: causal attention over the tokens of one step, (T, H*D) in and out.

    Honours what the families' layers pass it: a per-layer sliding window (Gemma-3, gpt-oss: the last `window`
    tokens, the query's own included, as flash-attention's (window - 1, 0)), a logits soft cap, and gpt-oss's
    attention sinks (one learned logit per head that joins the softmax and is then dropped)."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, *args, per_layer_sliding_window=None,
                 logits_soft_cap=None, sinks=None, **kwargs):
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.window, self.soft_cap = per_layer_sliding_window, logits_soft_cap
        self._sinks = (sinks,)  # a tuple: the owner registers (and loads) the parameter, not this stand-in

    def forward(self, query, key, value, *args, **kwargs):
        T = query.shape[0]
        q = query.view(T, self.num_heads, self.head_size).transpose(0, 1)  # (H, T, D)
        rep = self.num_heads // self.num_kv_heads
        k = key.view(T, self.num_kv_heads, self.head_size).transpose(0, 1).repeat_interleave(rep, 0)
        v = value.view(T, self.num_kv_heads, self.head_size).transpose(0, 1).repeat_interleave(rep, 0)
        scores = (q @ k.transpose(1, 2)).float() * self.scale  # (H, T, T)
        if self.soft_cap:
            scores = self.soft_cap * torch.tanh(scores / self.soft_cap)
        pos = torch.arange(T)
        allowed = pos[None, :] <= pos[:, None]  # (T, T): key <= query
        if self.window:
            allowed &= pos[:, None] - pos[None, :] < self.window
        scores = scores.masked_fill(~allowed, float("-inf"))
        sinks = self._sinks[0]
        if sinks is not None:
            sink = sinks.float().view(self.num_heads, 1, 1).expand(-1, T, 1)  # (H, T, 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]  # (H, T, T)
        else:
            probs = scores.softmax(-1)
        out = probs.to(v.dtype) @ v  # (H, T, D)
        return out.transpose(0, 1).reshape(T, self.num_heads * self.head_size)


class LatentAttention(torch.nn.Module):
    """Stands in for vLLM's MLAAttention (DeepSeek-V2/V3 multi-head latent attention: its backends, FlashMLA and
    the like, need a GPU and a paged latent cache). It receives what vLLM's MultiHeadLatentAttentionWrapper computed
    in vLLM's own code: the queries (T, H, nope + rope) with RoPE applied to their last `rope` dims, the normed latent
    kv_c (T, kv_lora_rank) and the shared RoPE key k_pe (T, 1, rope), roped; and it computes the attention
    transformers' DeepseekV3Attention does: keys and values expanded from the latent by the layer's own kv_b_proj
    ((T, H, nope + v)), each head's key [k_nope, k_pe], causal softmax at vLLM's scale, (T, H * v) out."""

    def __init__(self, num_heads, scale, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, q_lora_rank, kv_lora_rank,
                 kv_b_proj, *args, **kwargs):
        super().__init__()
        self.num_heads, self.scale = num_heads, scale
        self.nope, self.rope, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self._kv_b_proj = (kv_b_proj,)  # a tuple: the attention module owns (and loads) it, not this stand-in
        self.layer_name = kwargs.get("prefix", "")

    def forward(self, q, kv_c_normed, k_pe, *args, output_shape=None, **kwargs):
        T, H = q.shape[0], self.num_heads
        kv = self._kv_b_proj[0](kv_c_normed)[0].view(T, H, self.nope + self.v_head_dim)
        k_nope, v = kv.split([self.nope, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.view(T, 1, self.rope).expand(T, H, self.rope)], dim=-1)  # (T, H, nope + rope)
        scores = (q.view(T, H, -1).transpose(0, 1) @ k.permute(1, 2, 0)).float() * self.scale  # (H, T, T)
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out = probs.to(v.dtype) @ v.transpose(0, 1)  # (H, T, v)
        return out.transpose(0, 1).reshape(T, H * self.v_head_dim)


class ContextAttention(CausalAttention):
    """Stands in for the paged Attention of vLLM's DFlash layers: the context's keys and values are written once
    (`impl.do_kv_cache_update`, from precompute_and_store_context_kv) and a block's queries attend to them and to
    the whole block, both ways, as DFlash's non-causal draft attention does."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "impl", self)  # not a submodule of itself
        self.kv_cache, self.context = None, None

    def do_kv_cache_update(self, attn, key, value, kv_cache, slot_mapping):
        attn.context = (key.reshape(key.shape[0], -1), value.reshape(value.shape[0], -1))  # (C, kv*D) each

    def forward(self, query, key, value, *args, **kwargs):
        Q, rep = query.shape[0], self.num_heads // self.num_kv_heads
        keys, values = (torch.cat([c, x]) for c, x in zip(self.context, (key, value)))  # (C + Q, kv*D)
        q = query.view(Q, self.num_heads, self.head_size).transpose(0, 1)  # (H, Q, D)
        k = keys.view(-1, self.num_kv_heads, self.head_size).transpose(0, 1).repeat_interleave(rep, 0)
        v = values.view(-1, self.num_kv_heads, self.head_size).transpose(0, 1).repeat_interleave(rep, 0)
        probs = ((q @ k.transpose(1, 2)).float() * self.scale).softmax(-1)  # (H, Q, C + Q)
        return (probs.to(v.dtype) @ v).transpose(0, 1).reshape(Q, self.num_heads * self.head_size)


class TorchOps:
    """Stands in for the fused CUDA kernels vLLM's DFlash context path calls (`vllm._custom_ops`): RMSNorm (a
    weight per row group when it is 2-D: one per layer) and in-place RoPE on the query, neox or GPT-J style."""

    @staticmethod
    def rms_norm(out, x, weight, eps):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        w = weight.float().view(weight.shape[0], *([1] * (x.dim() - 2)), -1) if weight.dim() == 2 else weight.float()
        out.copy_((normed * w).to(out.dtype))

    @staticmethod
    def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
        for x in (query, key):
            if x is None:
                continue
            heads = x.view(x.shape[0], -1, head_size)
            cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)  # (T, rot/2) each
            cos, sin = cos[:, None], sin[:, None]
            rot = cos.shape[-1] * 2
            part = heads[..., :rot].float()
            if is_neox:
                x1, x2 = part[..., : rot // 2], part[..., rot // 2:]
                turned = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
            else:
                x1, x2 = part[..., 0::2], part[..., 1::2]
                turned = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
            heads[..., :rot] = turned.to(x.dtype)


# ------------------------------------------------------------------------------------------------- vLLM

# torchvision stands in where the project's torch has none built for it (a PyPI torchvision needs the CUDA torch it
# was built with): vLLM's Qwen3.5 module imports Qwen-VL's image and video processors, which import it, and a text
# model never calls them. A package on PYTHONPATH, so that vLLM's registry subprocess (which inspects a model class
# by importing its module) sees it too; any name in it imports and fails when used.
ABSENT_TORCHVISION = textwrap.dedent('''
    """A stand-in written by draftsmith's scripts/engine_worker.py: importable, never usable."""
    import importlib.abc, importlib.machinery, sys, types

    __version__ = "0.0"


    class Absent:
        def __init__(self, name):
            self._name = name

        def __getattr__(self, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return Absent(f"{self._name}.{attr}")

        def __call__(self, *args, **kwargs):
            raise RuntimeError(f"{self._name}: torchvision is a stand-in in this environment")

        def __mro_entries__(self, bases):
            return (object,)


    def _attribute(name):
        def get(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return Absent(f"{name}.{attr}")
        return get


    __getattr__ = _attribute(__name__)


    class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name.startswith(__name__ + "."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            module = types.ModuleType(spec.name)
            module.__path__ = []
            module.__getattr__ = _attribute(spec.name)
            return module

        def exec_module(self, module):
            pass


    sys.meta_path.append(_Submodules())
''')


def _absent_torchvision() -> None:
    import importlib.util
    import tempfile

    if importlib.util.find_spec("torchvision") is not None:
        return
    folder = tempfile.mkdtemp(prefix="draftsmith-absent-")
    os.makedirs(os.path.join(folder, "torchvision"))
    with open(os.path.join(folder, "torchvision", "__init__.py"), "w") as handle:
        handle.write(ABSENT_TORCHVISION)
    sys.path.insert(0, folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))


def _vllm_setup():
    _absent_torchvision()
    from vllm.distributed import destroy_model_parallel, init_distributed_environment, initialize_model_parallel

    _stand_in_moe()

    def init_parallel():
        # per case: vLLM makes the expert-parallel group only when the current config's model is a MoE
        destroy_model_parallel()
        initialize_model_parallel(1, 1)

    return init_distributed_environment, init_parallel


def _stand_in_attention() -> None:
    """Paged attention needs a GPU and a block table. Every imported vLLM model module that builds `Attention`
    (the family's own, and llama.py whose layers Mistral, Phi-3 and the drafts reuse) gets CausalAttention;
    called after the registry imported the target's module."""
    from vllm.model_executor.layers.attention import Attention, MLAAttention

    for name, module in list(sys.modules.items()):
        if name.startswith("vllm.model_executor.models.") and getattr(module, "Attention", None) is Attention:
            module.Attention = ContextAttention if name.endswith(".qwen3_dflash") else CausalAttention
            if name.endswith(".qwen3_dflash"):
                module.ops = TorchOps
        # DeepSeek's latent attention: vLLM's MultiHeadLatentAttentionWrapper (layers/mla.py) builds MLAAttention
        if (name.startswith("vllm.model_executor.models.") or name == "vllm.model_executor.layers.mla") and \
                getattr(module, "MLAAttention", None) is MLAAttention:
            module.MLAAttention = LatentAttention


class NativeExperts:
    """Stands in for the routed experts' grouped-GEMM kernel (Triton / FlashInfer on a GPU; a CPU build's vllm._C
    kernels, absent from the CUDA wheel): the fused-MoE layer keeps vLLM's router, weights and weight loaders, and
    `forward_native` runs each selected expert's MLP in torch with vLLM's own activation's `forward_native`."""

    @staticmethod
    def is_monolithic() -> bool:  # the router runs first and passes topk_weights / topk_ids (a modular kernel)
        return False

    @staticmethod
    def forward_native(method, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        from vllm.model_executor.layers.activation import ReLUSquaredActivation, SiluAndMul, SwigluOAIAndMul
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation

        if layer.apply_router_weight_on_input:
            raise NotImplementedError("the native experts stand-in covers routed experts weighted after the MLP only")
        if shared_experts is not None:  # as a modular kernel's finalize: runs them only where the runner did not
            from vllm.model_executor.layers.fused_moe.runner.shared_experts import SharedExpertsOrder

            shared_experts(shared_experts_input, SharedExpertsOrder.MK_INTERNAL_OVERLAPPED)
        # SILU: w13 holds [gate; up]; SWIGLUOAI (gpt-oss): interleaved, with the defaults of the fused kernel
        # `swigluoai_and_mul(out, in)`, which takes no alpha / limit; RELU2_NO_MUL (Nemotron-H): w13 holds up only
        act = {MoEActivation.SILU: SiluAndMul, MoEActivation.SWIGLUOAI: SwigluOAIAndMul,
               MoEActivation.RELU2_NO_MUL: ReLUSquaredActivation}[layer.activation]()
        w13_bias, w2_bias = getattr(layer, "w13_bias", None), getattr(layer, "w2_bias", None)
        out = torch.zeros_like(x, dtype=torch.float32)  # (T, h)
        for slot in range(topk_ids.shape[1]):
            for expert in topk_ids[:, slot].unique().tolist():
                rows = topk_ids[:, slot] == expert
                up = x[rows] @ layer.w13_weight[expert].t()  # (n, 2I)
                if w13_bias is not None:
                    up = up + w13_bias[expert]
                down = act.forward_native(up) @ layer.w2_weight[expert].t()  # (n, I) -> (n, h)
                if w2_bias is not None:
                    down = down + w2_bias[expert]
                out[rows] += topk_weights[rows, slot, None].float() * down.float()
        return out.to(x.dtype)


class _PlatformSaying:
    """The real platform, except that the questions named in `answers` (method name -> what it returns) get those
    answers; one module of vLLM at a time sees it."""

    def __init__(self, platform, **answers):
        self._platform, self._answers = platform, answers

    def __getattr__(self, name):
        if name in self._answers:
            return lambda *args, **kwargs: self._answers[name]
        return getattr(self._platform, name)


def _cpu_routing(platform):
    """The platform as vLLM's router factory sees it: a CPU, so it builds CPURouter (vLLM's plain-torch softmax /
    grouped top-k) instead of routers that call CUDA ops (`_moe_C.topk_softmax`); all else is the real platform."""
    return _PlatformSaying(platform, is_cpu=True)


def _non_gated_experts(platform):
    """The platform as vLLM's fused-MoE config sees it: one whose kernels run experts without a gate (Nemotron-H's
    relu2 experts; FusedMoEConfig refuses them on a CPU), which NativeExperts runs; its other question (the fp8
    dtype) is the real platform's."""
    return _PlatformSaying(platform, is_cuda_alike=True)


def _stand_in_moe() -> None:
    """Unquantized fused-MoE layers pick NativeExperts: no backend to select (vLLM's oracle knows none for an
    unspecified platform), no kernel to build after loading (the OOT path), the torch forward above; routing is
    vLLM's CPURouter."""
    from vllm.model_executor.layers.fused_moe import config as moe_config
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend
    from vllm.model_executor.layers.fused_moe.router import router_factory

    method.select_unquantized_moe_backend = lambda *args, **kwargs: (UnquantizedMoeBackend.OOT, NativeExperts)
    method.UnquantizedFusedMoEMethod.forward_native = NativeExperts.forward_native
    router_factory.current_platform = _cpu_routing(router_factory.current_platform)
    moe_config.current_platform = _non_gated_experts(moe_config.current_platform)


def _vllm_config(served: str, case: dict, k: int = 3):
    """`served` is the model `vllm serve` is given: the target, or the merged folder itself, whose draft is then
    vLLM's default for the method (no `model` in --speculative-config: MTPSpeculatorConfig.default_model, the
    served checkpoint)."""
    from vllm.config import (CompilationConfig, DeviceConfig, ModelConfig, ParallelConfig, SpeculativeConfig,
                             VllmConfig)

    model_config = ModelConfig(model=served, tokenizer=served, dtype="float32", max_model_len=64, enforce_eager=True,
                               skip_tokenizer_init=True)
    parallel = ParallelConfig()
    method = {"eagle1": "eagle", "eagle3": "eagle3", "medusa": "medusa", "peagle": "eagle3",
              "dflash": "dflash", "mtp": "mtp"}[case["method"]]
    parallel_drafting = {"parallel_drafting": True} if case["method"] == "peagle" else {}  # P-EAGLE (vLLM <= 0.33)
    speculative = SpeculativeConfig(model=None if case.get("merged") else case["folder"], method=method,
                                    num_speculative_tokens=k,
                                    target_model_config=model_config, target_parallel_config=parallel,
                                    **parallel_drafting)
    return VllmConfig(model_config=model_config, speculative_config=speculative, parallel_config=parallel,
                      device_config=DeviceConfig(device="cpu"), compilation_config=CompilationConfig(mode=0, custom_ops=["none"]))  # forward_native


def _vllm_model(vllm_config, model_config, folder: str | None, *, checkpoint: bool = False):
    """The engine's class for `model_config`, its weights loaded by its `load_weights`. `checkpoint`: from a whole
    checkpoint as vLLM's DefaultModelLoader reads one (the files its index names, and its check that every
    parameter was loaded), as a merged MTP draft is; else from every safetensors file of `folder`."""
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
    from vllm.model_executor.models.registry import ModelRegistry

    cls, _ = ModelRegistry.resolve_model_cls(model_config.architectures, model_config=model_config)
    _stand_in_attention()
    model = cls(vllm_config=vllm_config, prefix="").eval()
    if checkpoint:
        from vllm.config import LoadConfig
        from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

        load_weights = model.load_weights

        def recorded(weights):  # what the class's load_weights says it filled (the loader's check adds to the set
            loaded = load_weights(weights)  # it gets every parameter of the modules it exempts)
            model.draftsmith_loaded = set(loaded or ())
            return loaded

        model.load_weights = recorded
        DefaultModelLoader(LoadConfig()).load_weights(model, model_config)
        del model.load_weights
        names = [name for name, _ in model.named_parameters()]
        model.draftsmith_parameters = len(names)
        model.draftsmith_unfilled = sorted(set(names) - model.draftsmith_loaded)
        return model
    files = sorted(glob.glob(os.path.join(folder or model_config.model, "*.safetensors")))
    model.load_weights(safetensors_weights_iterator(files, use_tqdm_on_load=False))
    if hasattr(model, "process_weights_after_loading") and hasattr(model, "precompute_and_store_context_kv"):
        model.process_weights_after_loading()  # DFlash from 0.34: its fused context buffers (0.33: in load_weights)
    return model


@torch.no_grad()
def run_vllm(job: dict) -> dict:
    from vllm.config import set_current_vllm_config

    init_env, init_parallel = _vllm_setup()
    ids = torch.load(job["inputs"])["input_ids"]
    results, initialized = {}, False
    for case in job["cases"]:
        try:
            served = case["folder"] if case.get("merged") else case["target"]
            vllm_config = _vllm_config(served, case)
            with set_current_vllm_config(vllm_config):
                if not initialized:
                    init_env(world_size=1, rank=0, local_rank=0, backend="gloo",
                             distributed_init_method=f"tcp://127.0.0.1:{29500 + os.getpid() % 1000}")
                    initialized = True
                init_parallel()
                draft_config = vllm_config.speculative_config.draft_model_config
                target, states, fallback = _vllm_target_states(vllm_config, served, ids)
                draft = _vllm_model(vllm_config, draft_config, case["folder"], checkpoint=case.get("merged", False))
                with _draft_context(vllm_config, ids.numel(), merged=case.get("merged", False)):
                    results[case["name"]] = _vllm_step(case["method"], target, draft, ids, states,
                                                       draft_config.hf_config,
                                                       vllm_config.speculative_config.num_speculative_tokens)
                if case.get("merged"):
                    results[case["name"]]["reads"] = _vllm_reads(vllm_config, draft)
                if fallback:
                    results[case["name"]]["target_states"] = fallback
                if case["format"] == "speculators":
                    results[case["name"]]["serve_dir"] = _serve_dir(case["folder"])
        except Exception as err:  # the engine's own error is the result
            results[case["name"]] = {"status": "failed", "error": one_line(err),
                                     "trace": traceback.format_exc(limit=-3)}
    return results


def _draft_context(vllm_config, num_tokens: int, *, merged: bool):
    """A merged draft is a layer of the target's own family, its fused-MoE layers included: they look up the forward
    context as the target's do."""
    import contextlib

    if not merged:
        return contextlib.nullcontext()
    from vllm.forward_context import set_forward_context

    return set_forward_context(None, vllm_config, num_tokens=num_tokens)


def _vllm_reads(vllm_config, draft) -> dict:
    """What vLLM made of a merged folder: the architecture its SpeculativeConfig mapped the served model to
    (`hf_config_override`, vllm/config/speculative.py), the registry's entry for it and the file of the class built
    here (the entry may resolve per platform: a CUDA build can pick another file), how many parameters it has and
    which of them its load_weights did not fill (its own account: DefaultModelLoader's strict check passes an
    unquantized model's linear, embedding and lm-head layers whether filled or not)."""
    from vllm.model_executor.models.registry import ModelRegistry

    draft_config = vllm_config.speculative_config.draft_model_config
    arch = draft_config.architectures[0]
    entry = ModelRegistry.models.get(arch)
    cls = type(draft)
    return {"served_arch": vllm_config.model_config.architectures[0], "arch": arch,
            "model_type": draft_config.hf_config.model_type,
            "entry": f"{getattr(entry, 'module_name', '?')}.{getattr(entry, 'class_name', '?')}",
            "file": os.path.relpath(inspect.getsourcefile(cls), os.path.dirname(os.path.dirname(
                inspect.getsourcefile(__import__("vllm"))))),
            "parameters": draft.draftsmith_parameters, "unfilled": draft.draftsmith_unfilled}


def _aux_layer_ids(hf_config) -> tuple[int, ...] | None:
    """The draft config's aux layer ids as vLLM reads them (top-level field, else eagle_config's); None: default."""
    layer_ids = getattr(hf_config, "eagle_aux_hidden_state_layer_ids", None) or \
        (getattr(hf_config, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")
    return tuple(int(i) for i in layer_ids) if layer_ids else None


def _vllm_target_states(vllm_config, target_dir: str, ids):
    """(target, (final hidden (T, h), aux states or None), fallback reason or None).

    The engine's target class for the family computes the states. If it cannot be built or run on this CPU, the
    transformers target does (vLLM's aux id k = the input of layer k = HF `hidden_states[k]`, in layer order), and
    `target` is the engine's own if it was built, else `TargetEmbedAndHead`: what the draft shares either way."""
    arch = vllm_config.model_config.architectures[0]
    eagle3 = vllm_config.speculative_config.method in ("eagle3", "dflash")  # both read aux layers
    target, reason = None, None
    try:
        target = _vllm_model(vllm_config, vllm_config.model_config, None)
    except Exception as err:  # noqa: BLE001 (why the engine's target cannot be built here goes into the verdict)
        reason = f"vLLM's {arch} builds not on CPU ({one_line(err)[:160]})"
    if target is not None:
        if eagle3:  # outside the try: vLLM's refusal of the target ("does not support EAGLE3") is the result
            _set_aux_layers(target, vllm_config)
        try:
            from vllm.forward_context import set_forward_context

            with set_forward_context(None, vllm_config, num_tokens=ids.numel()):  # fused-MoE layers look up theirs
                out = target.model(ids, torch.arange(ids.numel()), None)  # (input_ids, positions, intermediate)
            hidden, aux = out if isinstance(out, tuple) else (out, None)
            return target, (hidden, aux), None
        except Exception as err:  # noqa: BLE001 (as above)
            reason = f"vLLM's {arch} runs not on CPU ({one_line(err)[:160]})"
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    hs = hf(ids[None], output_hidden_states=True).hidden_states
    n = len(hs) - 1
    aux = None
    if eagle3:
        layer_ids = _aux_layer_ids(vllm_config.speculative_config.draft_model_config.hf_config)
        aux = [hs[k][0] for k in sorted(layer_ids or (2, n // 2, n - 3))]  # interfaces.py's default
    return target or TargetEmbedAndHead(vllm_config, target_dir), (hs[-1][0], aux), reason


def _set_aux_layers(target, vllm_config) -> None:
    """vLLM's own step (model runner V2, eagle3_utils.py: the SupportsEagle3 check, the config's ids or the
    model's default); by hand as gpu_model_runner did for releases without it."""
    try:
        from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import set_eagle3_aux_hidden_state_layers
    except ImportError:
        layer_ids = _aux_layer_ids(vllm_config.speculative_config.draft_model_config.hf_config)
        target.set_aux_hidden_state_layers(layer_ids or target.get_eagle3_default_aux_hidden_state_layers())
        return
    set_eagle3_aux_hidden_state_layers(target, vllm_config.speculative_config)


class TargetEmbedAndHead(torch.nn.Module):
    """The target's embeddings and lm_head in vLLM's own layer classes, loaded from the target checkpoint by their
    weight loaders: what the proposer shares with the draft, when the target class itself cannot be built here."""

    def __init__(self, vllm_config, target_dir: str):
        from safetensors.torch import load_file
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

        super().__init__()
        hf_config = vllm_config.model_config.hf_text_config
        vocab, hidden = hf_config.vocab_size, hf_config.hidden_size
        weights = {}
        for path in sorted(glob.glob(os.path.join(target_dir, "*.safetensors"))):
            weights.update(load_file(path))
        self.model = torch.nn.Module()
        self.model.embed_tokens = VocabParallelEmbedding(vocab, hidden, params_dtype=torch.float32)
        self.lm_head = ParallelLMHead(vocab, hidden, params_dtype=torch.float32)
        embed = weights["model.embed_tokens.weight"]
        for layer, weight in ((self.model.embed_tokens, embed), (self.lm_head, weights.get("lm_head.weight", embed))):
            layer.weight.weight_loader(layer.weight, weight)


PARALLEL_SLOTS = 2  # P-EAGLE: mask slots after the teacher-forced pairs (check_engines.reference_steps adds as many)
PARALLEL_TOKEN_KEYS = ("mask_token_id", "pard_token", "ptd_token_id")  # the proposer's order (vLLM 0.33)


def _vllm_step(method, target, draft, ids, states, draft_hf_config=None, k: int = 3) -> dict:
    hidden, aux = states
    next_ids = torch.cat([ids[1:], ids[-1:]])  # teacher forcing: the draft at t reads token t+1
    if method != "medusa":
        _share_with_draft(target, draft)
    if method == "medusa":
        blocks = draft(hidden)
        logits = torch.stack(draft.compute_logits(blocks))  # (heads, T, V)
        return {"status": "loaded", "logits": logits.float(), "token_ids": logits.argmax(-1),
                "hidden": torch.stack(blocks).float()}
    # the final state (EAGLE-1, MTP), or the aux layers' states combined by the draft (EAGLE-3, P-EAGLE, DFlash)
    features = hidden if aux is None else draft.combine_hidden_states(torch.cat(aux, dim=-1))
    if method == "dflash":
        return _vllm_dflash_block(draft, ids, features, draft_hf_config, k)
    if method == "peagle":  # the proposer's parallel drafting: mask slots read the token and combine(mask_hidden)
        token = next(getattr(draft_hf_config, key) for key in PARALLEL_TOKEN_KEYS
                     if getattr(draft_hf_config, key, None) is not None)
        next_ids = torch.cat([next_ids, torch.full((PARALLEL_SLOTS,), int(token))])
        slot = draft.combine_hidden_states(draft.mask_hidden.view(-1))
        features = torch.cat([features, slot.expand(PARALLEL_SLOTS, -1)])
    positions = torch.arange(next_ids.numel())
    shift = int(method == "mtp" and _zeroes_position_zero(draft))
    logits, fed_back = _draft_once(draft, next_ids, positions + shift, features)
    result = {"status": "loaded", "logits": logits, "token_ids": logits.argmax(-1), "hidden": fed_back.float()}
    if shift:  # the step as vLLM runs a prompt from its first token too: the compared step is the one above
        result["from_position_0"] = {"logits": _draft_once(draft, next_ids, positions, features)[0],
                                     "file": os.path.basename(inspect.getsourcefile(type(draft)))}
    return result


def _draft_once(draft, next_ids, positions, features):
    """(logits (T, V), the state fed back) of one draft forward: vLLM's drafts return what compute_logits reads
    and what the next step reads (the same tensor, or one of them, where a release returns one)."""
    draft_out = draft(next_ids, positions, features)
    head_input, fed_back = draft_out if isinstance(draft_out, tuple) else (draft_out, draft_out)
    return draft.compute_logits(head_input).float(), fed_back  # (T, V): draft ids mapped to target ids by vLLM


def _zeroes_position_zero(draft) -> bool:
    """Whether the draft's MTP layer zeroes the token embedding at position 0 (vLLM's DeepSeek and GLM MTP layers:
    `torch.where(positions.unsqueeze(-1) == 0, 0, inputs_embeds)`, "not needed by MTP"; ERNIE's:
    `inputs_embeds[positions == 0] = 0`), read from its forward's
    source. Our MtpHead does not: the teacher-forced step then runs at positions 1..T (RoPE sees the same relative
    offsets), and the step from position 0 is reported beside it."""
    for module in draft.modules():
        if any(hasattr(module, n) for n in ("enorm", "mtp_emb_norm")) and \
                any(hasattr(module, n) for n in ("eh_proj", "mtp_linear_proj")):
            source = inspect.getsource(type(module).forward)
            return re.search(r"positions\.unsqueeze\(-1\)\s*==\s*0|\[positions\s*==\s*0\]\s*=\s*0",
                             source) is not None
    return False


def _vllm_dflash_block(draft, ids, context, hf_config, k: int) -> dict:
    """The proposer's DFlash step: the context's keys and values stored once, then one block [the last token,
    mask x k] at the next positions (the proposer's block is num_speculative_tokens + 1, whatever block_size the
    folder says); the slots' logits (k, V) (check_engines.reference_steps runs the folder's block_size, which
    check_engines.py asks k to equal)."""
    length = ids.numel()
    draft.precompute_and_store_context_kv(context, torch.arange(length), torch.zeros(length, dtype=torch.long))
    block = k + 1
    tokens = torch.full((block,), int(hf_config.dflash_config["mask_token_id"]))
    tokens[0] = ids[-1]
    out = draft(tokens, torch.arange(length, length + block))  # (B, h): norm(out)
    logits = draft.compute_logits(out[1:]).float()
    return {"status": "loaded", "logits": logits, "token_ids": logits.argmax(-1), "hidden": out[1:].float()}


def _share_with_draft(target, draft) -> None:
    """What vLLM's EAGLE proposer does after loading the draft (`load_eagle_model` in
    v1/worker/gpu/spec_decode/eagle/utils.py, vLLM >= 0.33): the target's embeddings and lm_head go to the draft
    unless it holds its own differing copy; by hand, as llm_base_proposer does, for older releases."""
    try:
        from vllm.v1.worker.gpu.spec_decode.eagle import utils
    except ImportError:
        if not getattr(draft, "has_own_embed_tokens", False):
            draft.model.embed_tokens = getattr(target.model, "embed_tokens", None) or target.model.embedding
        if not getattr(draft, "has_own_lm_head", False):
            draft.lm_head = target.lm_head
            _share_mtp_heads(draft, target.lm_head)
        return
    utils.maybe_share_target_embed(draft, draft.model, target.model)
    head = utils.get_target_lm_head(target, target)
    # load_eagle_model's lm_head step (0.34 wraps it in share_target_lm_head; 0.33 inlines it)
    own = getattr(draft, "lm_head", None)
    if head is not None and utils._should_share(draft, "has_own_lm_head", own, head):  # noqa: SLF001
        if hasattr(draft, "lm_head"):
            del draft.lm_head
        draft.lm_head = head
        _share_mtp_heads(draft, head)


def _share_mtp_heads(draft, head) -> None:
    """load_eagle_model's next step (0.32 to 0.34; llm_base_proposer's `_maybe_share_lm_head` before): MTP layers
    compute logits through each layer's `shared_head.head`, not the model's lm_head, and get the target's too."""
    layers = getattr(getattr(draft, "model", None), "layers", None)
    for layer in (layers.values() if isinstance(layers, torch.nn.ModuleDict) else layers or ()):
        shared = getattr(layer, "shared_head", None)
        if shared is not None and hasattr(shared, "head"):
            del shared.head
            shared.head = head


def _serve_dir(folder: str) -> str:
    """What `vllm serve OUT` does first with a speculators folder: resolve the verifier named inside it."""
    from vllm.transformers_utils.config import maybe_override_with_speculators

    try:
        model, _, _ = maybe_override_with_speculators(folder, None, False)
    except Exception as err:  # noqa: BLE001 (vLLM's refusal is the result)
        return f"refused ({one_line(err)})"
    return f"serves the verifier {model}"


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
    states = {}  # target folder -> its hidden states (speculators trains on the transformers target's)
    results = {}
    for case in job["cases"]:
        try:
            if case["target"] not in states:
                target = AutoModelForCausalLM.from_pretrained(case["target"], dtype=torch.float32).eval()
                states[case["target"]] = target(ids[None], output_hidden_states=True).hidden_states
            hidden_states = states[case["target"]]
            config = SpeculatorModelConfig.from_pretrained(case["folder"])
            config.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex attention
            config.speculators_config.verifier.name_or_path = case["target"]  # this machine's copy of the target
            if case["method"] == "dflash":
                results[case["name"]] = _speculators_dflash_block(config, case["folder"], ids, hidden_states)
                continue
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
            if getattr(model.config, "norm_output", False):  # EAGLE-3.1: the next step reads norm(out)
                out = model.norm(out)
            d2t = getattr(model, "d2t", None)
            draft_ids = logits.argmax(-1)
            token_ids = draft_ids + d2t[draft_ids] if d2t is not None else draft_ids
            results[case["name"]] = {"status": "loaded", "logits": logits, "token_ids": token_ids,
                                     "hidden": out[0].float(), "draft_vocab": True}
        except Exception as err:
            results[case["name"]] = {"status": "failed", "error": one_line(err),
                                     "trace": traceback.format_exc(limit=-3)}
    return results


@torch.no_grad()
def _speculators_dflash_block(config, folder: str, ids, hidden_states) -> dict:
    """speculators' DFlashDraftModel (its config class, loader, fc, hidden_norm, Qwen3DFlashDecoderLayer, norm and
    the verifier's lm_head) on the block engine_worker's vLLM step drafts: [the last token, mask x (B-1)] after the
    whole context, attending to all of it and to itself."""
    from speculators.models.dflash import DFlashDraftModel

    model = DFlashDraftModel.from_pretrained(folder, config=config).eval()
    model.load_verifier_weights()
    length, block = ids.numel(), int(config.block_size)
    layers = list(config.aux_hidden_state_layer_ids)  # speculators: input of layer i
    context = model.hidden_norm(model.fc(torch.cat([hidden_states[i][0] for i in layers], dim=-1)))[None]
    tokens = torch.full((block,), int(config.mask_token_id))
    tokens[0] = ids[-1]
    x = model.embed_tokens(tokens)[None]
    positions = torch.arange(length + block)[None]
    cos_sin = model.rotary_emb(x, positions)
    for layer in model.layers:
        x = layer(target_hidden=context, hidden_states=x, attention_mask=None, position_embeddings=cos_sin)
    out = model.norm(x)[0, 1:]
    logits = model.verifier_lm_head(out).float()
    return {"status": "loaded", "logits": logits, "token_ids": logits.argmax(-1), "hidden": out.float()}


# ------------------------------------------------------------------------------------------------ SGLang

SGLANG_MODULES = {"eagle1": "sglang.srt.models.llama_eagle", "eagle3": "sglang.srt.models.llama_eagle3",
                  "dflash": "sglang.srt.models.dflash"}
# What SGLang's EAGLE workers call on the TARGET model: every draft shares its embeddings (eagle_worker_v2.py
# `init_lm_head` -> `get_embed_and_head`); EAGLE-3 has it capture the aux states (attention_backend_setup.py).
SGLANG_TARGET_HOOKS = {"eagle1": ("get_embed_and_head",),
                       "eagle3": ("set_eagle3_layers_to_capture", "get_embed_and_head"),
                       "dflash": ("set_dflash_layers_to_capture",)}  # its worker reads model.lm_head itself


def run_sglang(job: dict) -> dict:
    """SGLang's EAGLE modules import CUDA kernels and a torchvision built for its pinned torch; when they cannot
    be imported here, fall back to their installed SOURCE: the config keys the draft module reads
    (`getattr(config, KEY)`, `eagle_config.get(KEY)`), which the export must carry, since a missing one takes
    SGLang's default; that the draft architecture the export names is a class of that module; and, per target
    family, whether SGLang's class for the target (its `architectures`, methods inherited within sglang/srt/models
    included) has the hooks the EAGLE worker calls, and whether it shifts given aux ids by one (`val + 1`)."""
    import importlib

    classes = _sglang_classes()
    errors = {}  # module -> why it cannot be imported (None: it can)
    results = {}
    for case in job["cases"]:
        if case.get("merged"):
            results[case["name"]] = _sglang_nextn(case, classes, errors)
            continue
        module = SGLANG_MODULES[case["method"]]
        failed = [e for e in errors.values() if e]
        if module not in errors and failed:  # the package failed to import once: a retry sees it half-imported
            errors[module] = failed[0]
        if module not in errors:
            try:
                importlib.import_module(module)
                errors[module] = None
            except Exception as err:  # noqa: BLE001 (the reason it cannot be built here is the result)
                errors[module] = one_line(err)
        error = errors[module]
        keys = _source_config_keys(_sglang_source(module))
        config = json.loads(open(os.path.join(case["folder"], "config.json")).read())
        present = set(config) | set(config.get("eagle_config") or {})
        missing = {k: default for k, default in sorted(keys.items()) if k not in present}
        draft_arch = (config.get("architectures") or ["?"])[0]
        draft_file = classes.get(draft_arch, {}).get("file")
        target_arch = json.loads(open(os.path.join(case["target"], "config.json")).read())["architectures"][0]
        results[case["name"]] = {"status": "source", "module": module, "error": error or "imported (not run)",
                                 "keys": sorted(keys), "missing": missing,
                                 "draft_class": None if draft_file == _sglang_source(module) else draft_arch,
                                 "target": _target_hooks(classes, target_arch, SGLANG_TARGET_HOOKS[case["method"]])}
    return results


def _sglang_nextn(case: dict, classes: dict, errors: dict) -> dict:
    """A merged folder under NEXTN, from SGLang's installed source: the draft architecture ModelConfig gives the
    served checkpoint's (`_config_draft_model` rewrites `architectures[0]` for a draft model: the MTP class of the
    family), that class's file, and whether its module imports here (SGLang then builds it from the same
    checkpoint, the draft path defaulting to the model's)."""
    import importlib

    arch = json.loads(open(os.path.join(case["folder"], "config.json")).read())["architectures"][0]
    mapping = _sglang_draft_archs()
    draft = mapping.get(arch)
    file = classes.get(draft, {}).get("file") if draft else None
    if file:
        module = "sglang.srt.models." + os.path.basename(file)[:-3]
        failed = [e for e in errors.values() if e]
        if module not in errors and failed:  # as run_sglang: a retry would see the package half-imported
            errors[module] = failed[0]
        if module not in errors:
            try:
                importlib.import_module(module)
                errors[module] = None
            except Exception as err:  # noqa: BLE001 (the reason it cannot be built here is the result)
                errors[module] = one_line(err)
    error = (errors.get(module) if file else None) or "imported (not run)"
    return {"status": "source", "error": error, "nextn": {"arch": arch, "draft": draft,
                                                         "file": os.path.basename(file) if file else None,
                                                         "mapped": sorted(mapping)}}


def _sglang_draft_archs() -> dict[str, str]:
    """target architecture -> draft architecture, as ModelConfig._config_draft_model (sglang/srt/configs/
    model_config.py) rewrites a draft model's `architectures[0]`: every `if is_draft_model and
    ...architectures[0] == X` (or `in [X, ...]`) whose body assigns `...architectures[0] = Y`."""
    import ast

    path = _sglang_source("sglang.srt.configs.model_config")
    tree = ast.parse(open(path).read())
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.If) or "is_draft_model" not in ast.unparse(node.test):
            continue
        sources = []
        for test in ast.walk(node.test):
            if isinstance(test, ast.Compare) and "architectures" in ast.unparse(test.left):
                for right in test.comparators:
                    items = right.elts if isinstance(right, (ast.List, ast.Tuple, ast.Set)) else [right]
                    sources += [i.value for i in items if isinstance(i, ast.Constant)]
        targets = [stmt.value.value for stmt in node.body if isinstance(stmt, ast.Assign)
                   and isinstance(stmt.value, ast.Constant) and "architectures" in ast.unparse(stmt.targets[0])]
        for source in sources:
            if targets:
                found.setdefault(source, targets[-1])
    return found


def _sglang_source(module: str) -> str:
    """The installed file of an sglang module, found without importing the package (its __init__ needs CUDA)."""
    import importlib.util

    root = importlib.util.find_spec(module.split(".")[0]).submodule_search_locations[0]
    return os.path.join(root, *module.split(".")[1:]) + ".py"


def _sglang_classes() -> dict[str, dict]:
    """Every class of sglang/srt/models/*.py by name: its file, base names and methods; where a name is defined
    twice, the module whose EntryClass lists it (what SGLang's registry loads) wins."""
    import ast

    folder = os.path.dirname(_sglang_source("sglang.srt.models.llama"))
    found = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.py"))):
        tree = ast.parse(open(path).read())
        entry = {n.id for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", "") == "EntryClass" for t in node.targets)
                 for n in ast.walk(node.value) if isinstance(n, ast.Name)}
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and (node.name not in found or node.name in entry):
                bases = [getattr(b, "id", getattr(b, "attr", "")) for b in node.bases]
                found[node.name] = {"file": path, "bases": bases,
                                    "methods": {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}}
    return found


def _target_hooks(classes: dict, arch: str, hooks: tuple[str, ...]) -> dict:
    """{"class", "file", "missing": hooks no class of its MRO (within sglang/srt/models) defines, "shifts_ids"}."""
    import ast

    if arch not in classes:
        return {"class": arch, "file": None, "missing": list(hooks), "shifts_ids": None}
    methods, queue, seen = {}, [arch], set()
    while queue:  # breadth-first over the bases: a subclass's own method wins
        name = queue.pop(0)
        if name in seen or name not in classes:
            continue
        seen.add(name)
        for method, node in classes[name]["methods"].items():
            methods.setdefault(method, node)
        queue += classes[name]["bases"]
    shifts = None
    if "set_eagle3_layers_to_capture" in methods:
        shifts = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and isinstance(n.right, ast.Constant)
                     and n.right.value == 1 for n in ast.walk(methods["set_eagle3_layers_to_capture"]))
    return {"class": arch, "file": os.path.basename(classes[arch]["file"]),
            "missing": [h for h in hooks if h not in methods], "shifts_ids": shifts}


def _source_config_keys(path: str) -> dict[str, str]:
    """KEY -> its default as source text ("-" where none: a missing key raises) for every config key read."""
    import ast

    tree = ast.parse(open(path).read())
    keys = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            args = node.args
            if name == "getattr" and len(args) >= 2 and getattr(args[0], "id", "") == "config" \
                    and isinstance(args[1], ast.Constant):
                keys.setdefault(args[1].value, ast.unparse(args[2]) if len(args) > 2 else "-")
            if name == "get" and isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "eagle_config" \
                    and isinstance(args[0], ast.Constant):
                keys.setdefault(args[0].value, ast.unparse(args[1]) if len(args) > 1 else "None")
    return keys


RUNNERS = {"vllm": run_vllm, "speculators": run_speculators, "sglang": run_sglang}


def main() -> int:
    job = json.loads(open(sys.argv[1]).read())
    results = RUNNERS[job["engine"]](job)
    torch.save(results, job["out"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
