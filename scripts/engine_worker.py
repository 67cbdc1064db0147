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
engine mapped the folder to, for a merged one, "load": what SGLang's loader did with the folder}, or
{"status": "load", "load", "reason": why no step ran}, or {"status": "failed", "error": one line}. Nothing here
imports draftsmith: the engine's code is the only reader.

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
has no build of it (`ABSENT_PACKAGE`). Where the engine's target class still cannot be built or run on a CPU,
the hidden states come from the transformers target and the verdict says so; the engine's draft class and
`load_weights` still load and run the export. An MTP layer that zeroes the token embedding at position 0 (vLLM's
DeepSeek and GLM ones; our head does not) is compared at positions 1..T, its step from 0 reported beside it
(`_zeroes_position_zero`). SGLang runs as its own CPU engine (`_sglang_setup`: its ops' forward_native; stand-ins
for sgl-kernel's CPU kernels, its attention backend and its logits processor's pruning) and its loader is watched
(`_recorded_loading`); see `run_sglang`.
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


def _held_in(tensor, parameters) -> bool:
    """Whether some parameter holds `tensor`'s values as consecutive rows (a fused projection, a stacked expert)."""
    rows = tensor.shape[0] if tensor.dim() else 1
    for param in parameters:
        if tensor.dim() == 0 or param.dim() < tensor.dim() or param.shape[param.dim() - tensor.dim() + 1:] != \
                tensor.shape[1:]:
            continue
        flat = param.detach().reshape(-1, *tensor.shape[1:])  # (rows of every leading index, *trailing)
        if any(torch.equal(flat[start:start + rows], tensor.to(flat.dtype))
               for start in range(flat.shape[0] - rows + 1)):
            return True
    return False


class CausalAttention(torch.nn.Module):
    """Stands in for vLLM's paged Attention: causal attention over the tokens of one step, (T, H*D) in and out.

    Honours what the families' layers pass it: a per-layer sliding window (Gemma-3, gpt-oss, MiMo-V2: the last
    `window` tokens, the query's own included, as flash-attention's (window - 1, 0)), a logits soft cap, gpt-oss's and
    MiMo-V2's attention sinks (one learned logit per head that joins the softmax and is then dropped), and values
    narrower than keys (MiMo-V2's head_size_v)."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, *args, per_layer_sliding_window=None,
                 logits_soft_cap=None, sinks=None, head_size_v=None, **kwargs):
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.head_size_v = head_size_v or head_size
        self.num_kv_heads = num_kv_heads or num_heads
        self.window, self.soft_cap = per_layer_sliding_window, logits_soft_cap
        self._sinks = (sinks,)  # a tuple: the owner registers (and loads) the parameter, not this stand-in

    def forward(self, query, key, value, *args, **kwargs):
        T = query.shape[0]
        q = query.view(T, self.num_heads, self.head_size).transpose(0, 1)  # (H, T, D)
        rep = self.num_heads // self.num_kv_heads
        k = key.view(T, self.num_kv_heads, self.head_size).transpose(0, 1).repeat_interleave(rep, 0)
        v = value.view(T, self.num_kv_heads, self.head_size_v).transpose(0, 1).repeat_interleave(rep, 0)
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
        out = probs.to(v.dtype) @ v  # (H, T, Dv)
        return out.transpose(0, 1).reshape(T, self.num_heads * self.head_size_v)


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
        self._indexer = (kwargs.get("indexer"),)  # DeepSeek-V3.2's lightning indexer (indexer_stand_in), when sparse
        self.layer_name = kwargs.get("prefix", "")
        object.__setattr__(self, "impl", self)  # the sparse wrapper tells its impl the top-k is ready (no-op here)

    def record_logical_topk_ready(self) -> None:
        pass

    def forward(self, q, kv_c_normed, k_pe, *args, output_shape=None, **kwargs):
        T, H = q.shape[0], self.num_heads
        kv = self._kv_b_proj[0](kv_c_normed)[0].view(T, H, self.nope + self.v_head_dim)
        k_nope, v = kv.split([self.nope, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.view(T, 1, self.rope).expand(T, H, self.rope)], dim=-1)  # (T, H, nope + rope)
        scores = (q.view(T, H, -1).transpose(0, 1) @ k.permute(1, 2, 0)).float() * self.scale  # (H, T, T)
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        indexer = self._indexer[0]
        if indexer is not None:  # each query attends to the keys its layer's indexer kept
            allowed = allowed & torch.zeros(T, T, dtype=torch.bool).scatter_(1, indexer.draftsmith_topk, True)
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out = probs.to(v.dtype) @ v.transpose(0, 1)  # (H, T, v)
        return out.transpose(0, 1).reshape(T, H * self.v_head_dim)


def indexer_stand_in(self, hidden_states, qr, positions, rotary_emb):
    """Stands in for vLLM's DeepSeek-V3.2 `Indexer.forward` (deepseek_v2.py), whose scoring is an fp8 kernel
    (SparseAttnIndexer: DeepGEMM on a GPU) writing the top-k into a paged buffer: from vLLM's own wq_b, fused
    wk_weights_proj, k_norm and RoPE (the split and rotation of its plain path), the scores transformers'
    DeepseekV32Indexer computes, sum over heads of w * relu(q . k) * scale, causal, and each query's top index_topk
    keys, kept on the module for LatentAttention (T, k)."""
    T = hidden_states.shape[0]
    q = self.wq_b(qr)[0].view(T, self.n_head, self.head_dim)
    kw = self.wk_weights_proj(hidden_states)[0]
    k, weights = self.k_norm(kw[:, : self.head_dim]), kw[:, self.head_dim:]
    q_pe, q_nope = q.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
    k_pe, k_nope = k.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
    q_pe, k_pe = rotary_emb(positions, q_pe.contiguous(), k_pe.unsqueeze(1).contiguous())
    q = torch.cat([q_pe.reshape(T, self.n_head, self.rope_dim), q_nope], dim=-1)  # (T, H, D)
    k = torch.cat([k_pe.reshape(T, self.rope_dim), k_nope], dim=-1)  # (T, D)
    scores = (q.float() @ k.float().t()).relu() * self.softmax_scale  # (T, H, T)
    index = (weights.float()[:, None, :] * self.n_head_scale @ scores)[:, 0]  # (T, T)
    index = index.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    self.draftsmith_topk = index.topk(min(self.topk_tokens, T), dim=-1).indices


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

# A package that stands in where the engine imports one this environment cannot have (torchvision needs the CUDA torch
# it was built with; SGLang's sgl_kernel is a CUDA or source-built CPU library; IPython is a notebook's): vLLM's Qwen3.5
# module imports Qwen-VL's image and video processors, which import torchvision, and a text model never calls them;
# SGLang's import path reaches all three. A package on PYTHONPATH, so that vLLM's registry subprocess (which inspects
# a model class by importing its module) sees it too; any name in it imports and fails, naming itself, when used.
ABSENT_PACKAGE = textwrap.dedent('''
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
            raise RuntimeError(f"{self._name}: a stand-in in this environment (scripts/engine_worker.py)")

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


def _absent_packages(*names: str) -> None:
    """ABSENT_PACKAGE under each name that does not import here."""
    import importlib.util
    import tempfile

    names = [name for name in names if importlib.util.find_spec(name) is None]
    if not names:
        return
    folder = tempfile.mkdtemp(prefix="draftsmith-absent-")
    for name in names:
        os.makedirs(os.path.join(folder, name))
        with open(os.path.join(folder, name, "__init__.py"), "w") as handle:
            handle.write(ABSENT_PACKAGE)
    sys.path.insert(0, folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))


def _vllm_setup():
    _absent_packages("torchvision")
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
        # DeepSeek-V3.2's lightning indexer: its scoring in torch; its buffers on the CPU (the platform vLLM finds
        # here, none, names no device)
        if name.endswith((".deepseek_v2", ".deepseek_mtp")) and hasattr(module, "current_platform"):
            if hasattr(module, "Indexer"):
                module.Indexer.forward = indexer_stand_in
            if not module.current_platform.device_type:
                module.current_platform = _PlatformOnCpu(module.current_platform)


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


class _PlatformOnCpu(_PlatformSaying):
    """The real platform, whose device is the CPU (vLLM's DeepSeek-V3.2 modules allocate their top-k buffers on
    `current_platform.device_type`, empty for the platform vLLM finds here)."""

    device_type = "cpu"


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
              "dflash": "dflash", "mtp": "mtp", "gemma4_assistant": "mtp"}[case["method"]]
    parallel_drafting = {"parallel_drafting": True} if case["method"] == "peagle" else {}  # P-EAGLE (vLLM <= 0.33)
    speculative = SpeculativeConfig(model=None if case.get("merged") else case["folder"], method=method,
                                    num_speculative_tokens=k,
                                    target_model_config=model_config, target_parallel_config=parallel,
                                    **parallel_drafting)
    return VllmConfig(model_config=model_config, speculative_config=speculative, parallel_config=parallel,
                      device_config=DeviceConfig(device="cpu"),
                      compilation_config=CompilationConfig(mode=0, custom_ops=["none"]))  # forward_native


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
                if case["method"] in KV_READERS:
                    results[case["name"]] = _vllm_load_only(vllm_config, case)
                    continue
                draft_config = vllm_config.speculative_config.draft_model_config
                target, states, fallback = _vllm_target_states(vllm_config, served, ids)
                draft = _vllm_model(vllm_config, draft_config, case["folder"], checkpoint=case.get("merged", False))
                with _draft_context(vllm_config, ids.numel(), merged=case.get("merged", False)):
                    results[case["name"]] = _vllm_step(case["method"], target, draft, ids, states,
                                                       draft_config.hf_config,
                                                       vllm_config.speculative_config.num_speculative_tokens)
                if case.get("merged"):
                    results[case["name"]]["reads"] = _vllm_reads(vllm_config, draft)
                    wider = _one_key_wider(vllm_config, case, target, draft, ids, states, engine_states=not fallback)
                    if wider is not None:
                        results[case["name"]]["window_plus_one"] = wider
                if fallback:
                    results[case["name"]]["target_states"] = fallback
                if case["format"] == "speculators":
                    results[case["name"]]["serve_dir"] = _serve_dir(case["folder"])
        except Exception as err:  # the engine's own error is the result
            results[case["name"]] = {"status": "failed", "error": one_line(err),
                                     "trace": traceback.format_exc(limit=-3)}
    return results


# drafts whose step attends to the target's own keys and values (the engine's paged KV cache, not stood in here):
# loaded by the engine's loader and class, not stepped
KV_READERS = {"gemma4_assistant": "its step reads the target's keys and values from the engine's KV cache, not "
                                  "stood in here"}


def _vllm_load_only(vllm_config, case: dict) -> dict:
    """The draft class vLLM's SpeculativeConfig maps the folder to, loaded by its DefaultModelLoader: which of the
    folder's tensors no parameter holds, which parameters its load_weights did not fill (its own account)."""
    from safetensors import safe_open

    draft = _vllm_model(vllm_config, vllm_config.speculative_config.draft_model_config, case["folder"],
                        checkpoint=True)
    tensors = {}
    for path in sorted(glob.glob(os.path.join(case["folder"], "*.safetensors"))):
        with safe_open(path, framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
    parameters = dict(draft.named_parameters())
    load = {"class": type(draft).__name__, "file": os.path.basename(inspect.getsourcefile(type(draft))),
            "tensors": list(tensors), "parameters": len(parameters), "unfilled": draft.draftsmith_unfilled,
            "unread": [name for name, tensor in tensors.items()
                       if not _held_in(tensor, [*parameters.values(), *draft.buffers()])]}
    return {"status": "load", "load": load, "reason": KV_READERS[case["method"]]}


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


def _one_key_wider(vllm_config, case: dict, target, draft, ids, states, *, engine_states: bool) -> dict | None:
    """A sliding-window MTP layer (MiMo-V2): the case again with every window of the draft and of the engine's target
    one key wider (transformers' and SGLang's window is sliding_window_size + 1 keys, vLLM's sliding_window_size);
    {"logits", "window": the draft's own}, None where the draft has no window."""
    from vllm.forward_context import set_forward_context

    drafts = [m for m in draft.modules() if isinstance(m, CausalAttention) and m.window]
    if not drafts:
        return None
    windows = [m for model in (target, draft) for m in model.modules() if isinstance(m, CausalAttention) and m.window]
    for attention in windows:
        attention.window += 1
    try:
        if engine_states:  # the engine's target attends within its windows too
            with set_forward_context(None, vllm_config, num_tokens=ids.numel()):
                out = target.model(ids, torch.arange(ids.numel()), None)
            states = (out[0] if isinstance(out, tuple) else out, None)
        with _draft_context(vllm_config, ids.numel(), merged=True):
            step = _vllm_step(case["method"], target, draft, ids, states)
    finally:
        for attention in windows:
            attention.window -= 1
    return {"logits": step["logits"], "window": drafts[0].window}


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

class AbsentKernels:
    """Stands in for `torch.ops.sgl_kernel` where it lacks the kernels of sgl-kernel's CPU build (named `*_cpu`),
    which SGLang's CPU engine calls and PyPI does not ship: a module that binds one at import (Qwen3.5's
    `fused_sigmoid_mul_cpu`) imports, and a step that calls one fails naming it. Other names are the real namespace's
    (SGLang asks it whether a GPU kernel exists before registering its fake)."""

    def __init__(self, namespace):
        self._namespace = namespace

    def __getattr__(self, name):
        try:
            return getattr(self._namespace, name)
        except AttributeError:
            if name.endswith("_cpu"):
                return AbsentKernel(name)
            raise


class AbsentKernel:
    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, overload):  # torch.ops.sgl_kernel.NAME.default
        if overload.startswith("__"):
            raise AttributeError(overload)
        return self

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"SGLang's CPU kernel torch.ops.sgl_kernel.{self.name} (sgl-kernel's CPU build, not on "
                           f"PyPI) is not installed here")


class SglangAttention:
    """Stands in for SGLang's attention backend (the ForwardContext's `attn_backend`, which every RadixAttention
    calls; its backends need a GPU or sgl-kernel's CPU build and a paged KV pool): causal attention over the step's
    tokens with the layer's own heads, head sizes (values may be narrower than keys: DeepSeek's expanded latent),
    scale, logit cap and sliding window (SGLang's `sliding_window_size` counts the keys before the query's own). It
    names no backend, so a model that picks its attention path by backend takes SGLang's default for the device, and
    holds no KV pool: a layer that writes its cache through the pool itself (DeepSeek's latent) stops there."""

    prefill_attention_backend_str = decode_attention_backend_str = None

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if kwargs.get("k_rope") is not None:  # the absorbed latent (MLA) layout hands the rope part apart
            raise NotImplementedError("the attention stand-in covers multi-head attention, not the latent layout")
        T, heads, kv_heads = q.shape[0], layer.tp_q_head_num, layer.tp_k_head_num
        q = q.reshape(T, heads, -1).transpose(0, 1)  # (H, T, D)
        k = k.reshape(T, kv_heads, -1).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)  # (H, T, D)
        v = v.reshape(T, kv_heads, -1).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)  # (H, T, Dv)
        scores = (q @ k.transpose(1, 2)).float() * layer.scaling  # (H, T, T)
        if layer.logit_cap:
            scores = layer.logit_cap * torch.tanh(scores / layer.logit_cap)
        pos = torch.arange(T)
        allowed = pos[None, :] <= pos[:, None]  # (T, T): key <= query
        if layer.sliding_window_size >= 0:
            allowed &= pos[:, None] - pos[None, :] <= layer.sliding_window_size
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        return (probs.to(v.dtype) @ v).transpose(0, 1).reshape(T, -1)  # (T, H * Dv)


class LogitsReader(torch.nn.Module):
    """Stands in for a model's LogitsProcessor for one step: keeps the state the EAGLE worker hands on (the aux
    states concatenated where the model captures them, else what its lm_head reads) and returns every position's
    logits from the processor's own lm-head product (the processor prunes an extend batch to its last token)."""

    def __init__(self, processor):
        super().__init__()
        self.processor, self.state = processor, None

    def forward(self, input_ids, hidden_states, lm_head, forward_batch=None, aux_hidden_states=None, *args, **kwargs):
        self.state = torch.cat(list(aux_hidden_states), dim=-1) if aux_hidden_states else hidden_states
        return self.processor._compute_lm_head(hidden_states, lm_head)[:, :self.processor.vocab_size]  # noqa: SLF001


def _sglang_setup() -> None:
    """SGLang's CPU engine (`SGLANG_USE_CPU_ENGINE`): on a CPU without AMX tiles its ops run their forward_native
    (sglang/kernels/fused_op.py `_platform_key`); the packages its import path needs and this environment cannot
    have are stand-ins (`_absent_packages`, `AbsentKernels`); the distributed groups are SGLang's own for one
    process on gloo (its test helper `init_single_process_dist`); `torch.cuda.synchronize`, which the MTP classes
    call after taking the target's embeddings, does nothing."""
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    _absent_packages("torchvision", "IPython", "sgl_kernel")
    torch.ops.sgl_kernel = AbsentKernels(torch.ops.sgl_kernel)
    torch.cuda.synchronize = lambda *args, **kwargs: None  # the MTP classes' set_embed_and_head waits for the GPU
    from sglang.test.layer_ut_utils import init_single_process_dist

    init_single_process_dist(master_port=29500 + os.getpid() % 1000)


def _sglang_batch(ids, hidden=None):
    """One request's extend batch; `hidden`: the draft input's states (the EAGLE worker's spec_info)."""
    import types

    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    T = ids.numel()
    batch = ForwardBatch(forward_mode=ForwardMode.EXTEND, batch_size=1, input_ids=ids,
                         req_pool_indices=torch.zeros(1, dtype=torch.long), seq_lens=torch.tensor([T]),
                         out_cache_loc=torch.arange(T), seq_lens_sum=T, positions=torch.arange(T),
                         extend_seq_lens=torch.tensor([T]), extend_seq_lens_cpu=[T],
                         extend_prefix_lens=torch.tensor([0]), extend_prefix_lens_cpu=[0])  # no cached prefix
    if hidden is not None:
        batch.spec_info = types.SimpleNamespace(hidden_states=hidden)
    return batch


def _sglang_forward(model, ids, positions, hidden=None):
    """(logits (T, V), the state handed on) of the model's own forward over one extend batch."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    reader = LogitsReader(model.logits_processor)
    processor, model.logits_processor = model.logits_processor, reader
    try:
        with forward_context(ForwardContext(attn_backend=SglangAttention())):
            logits = model(ids, positions, _sglang_batch(ids, hidden))
    finally:
        model.logits_processor = processor
    return logits.float(), reader.state


def _sglang_model(folder: str, *, draft: bool, algorithm: str | None = None):
    """(SGLang's class for the folder as its ModelConfig reads it, loaded by its DefaultModelLoader, what the load
    did: `_recorded_loading`)."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import get_model

    config = ModelConfig(folder, is_draft_model=draft, dtype="float32", speculative_algorithm=algorithm)
    with _recorded_loading() as record:
        model = get_model(model_config=config, load_config=LoadConfig(), device_config=DeviceConfig("cpu"))
    record["class"] = type(model).__name__
    record["file"] = os.path.basename(inspect.getsourcefile(type(model)))
    return model, record


def _recorded_loading():
    """While loading: every floating parameter is NaN first and every weight loader notes the checkpoint tensor it
    is given (by its storage), so the record says which tensors the class's load_weights neither passed to a loader
    nor holds in a parameter it fused them into (`_held_in`: DeepSeek's q_a and kv_a projections are concatenated
    first) ("unread"), and which parameters it left unfilled, wholly or in part."""
    import contextlib

    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.model_loader.weight_utils import default_weight_loader

    original = DefaultModelLoader.load_weights_and_postprocess
    record = {}

    def recorded(model, weights, target_device):
        names, read = {}, set()

        tensors = {}

        def listed(weights):
            for name, tensor in weights:
                names[tensor.untyped_storage().data_ptr()] = name
                tensors[name] = tensor
                yield name, tensor

        for param in model.parameters():
            held = "_weight_loader" if isinstance(getattr(type(param), "weight_loader", None), property) \
                else "weight_loader"
            loader = getattr(param, held, None) or default_weight_loader

            def noting(*args, _loader=loader, **kwargs):
                given = kwargs.get("loaded_weight", args[1] if len(args) > 1 else None)
                if isinstance(given, torch.Tensor):
                    read.add(names.get(given.untyped_storage().data_ptr()))
                return _loader(*args, **kwargs)

            setattr(param, held, noting)
            if param.is_floating_point():
                param.data.fill_(float("nan"))
        original(model, listed(weights), target_device)
        parameters = dict(model.named_parameters())
        held = [*parameters.values(), *model.buffers()]  # Gemma 4's layer_scalar is a buffer
        record.update(tensors=list(tensors), parameters=len(parameters),
                      unread=[n for n, t in tensors.items() if n not in read and not _held_in(t, held)],
                      unfilled=sorted(n for n, p in parameters.items()
                                      if p.is_floating_point() and bool(p.isnan().all())),
                      partly=sorted(n for n, p in parameters.items()
                                    if p.is_floating_point() and bool(p.isnan().any()) and not bool(p.isnan().all())))

    DefaultModelLoader.load_weights_and_postprocess = staticmethod(recorded)

    @contextlib.contextmanager
    def scope():
        try:
            yield record
        finally:
            DefaultModelLoader.load_weights_and_postprocess = staticmethod(original)

    return scope()


@torch.no_grad()
def run_sglang(job: dict) -> dict:
    """SGLang's own ModelConfig, classes and DefaultModelLoader load each export (an EAGLE draft beside the target;
    a merged MTP folder as the served target, its NEXTN draft the class ModelConfig maps it to, from the same
    folder), and the draft's own forward runs one teacher-forced step on the states SGLang's target class hands it
    (`_sglang_target`); the target's embeddings and lm_head go to the draft as the EAGLE worker's init_lm_head
    puts them."""
    _sglang_setup()
    ids = torch.load(job["inputs"])["input_ids"]
    results = {}
    for case in job["cases"]:
        try:
            results[case["name"]] = _sglang_case(case, ids)
        except Exception as err:  # the engine's own error is the result
            results[case["name"]] = {"status": "failed", "error": one_line(err),
                                     "trace": traceback.format_exc(limit=-3)}
    return results


SGLANG_ALGORITHMS = {"eagle1": "EAGLE", "eagle3": "EAGLE3", "dflash": "DFLASH", "mtp": "NEXTN",
                     "gemma4_assistant": "FROZEN_KV_MTP"}


def _sglang_case(case: dict, ids) -> dict:
    method = case["method"]
    draft, record = _sglang_model(case["folder"], draft=True, algorithm=SGLANG_ALGORITHMS[method])
    layer_file = os.path.join(case["folder"], "model-mtp.safetensors")  # a merged folder: the drafter's own layer
    if case.get("merged") and os.path.isfile(layer_file):
        from safetensors import safe_open

        with safe_open(layer_file, framework="pt") as handle:
            record["own"] = sorted(handle.keys())
    if method in KV_READERS:
        return {"status": "load", "load": record, "reason": KV_READERS[method]}
    if method == "dflash":  # its block attends to the context's keys and values, stored by SGLang's DFlash worker
        return {"status": "load", "load": record, "reason": "its block reads the context's keys and values from "
                                                            "SGLang's KV pool, not stood in here"}
    served = case["folder"] if case.get("merged") else case["target"]
    aux_ids = (getattr(draft.config, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")
    target, states, fallback = _sglang_target(served, ids, eagle3=method == "eagle3", aux_ids=aux_ids)
    embed, head = _sglang_embed_and_head(target, draft, served)
    if method == "eagle3" and not getattr(draft, "load_lm_head_from_target", False):
        draft.set_embed(embed)  # eagle_worker_v2.init_lm_head: an EAGLE-3 draft keeps its own lm_head
    else:
        draft.set_embed_and_head(embed, head)
    hot = getattr(draft, "hot_token_id", None)
    if hot is not None:  # d2t is read into the draft-to-target map, no parameter
        record["unread"] = [name for name in record["unread"] if name != "d2t"]
    record["unfilled_shared"] = [name for name, p in draft.named_parameters()
                                 if p.is_floating_point() and bool(p.isnan().all())]
    next_ids = torch.cat([ids[1:], ids[-1:]])  # teacher forcing: the draft at t reads token t+1
    positions = torch.arange(ids.numel())
    shift = int(case.get("merged", False) and _zeroes_position_zero(draft))
    try:
        logits, fed_back = _sglang_forward(draft, next_ids, positions + shift, states)
    except Exception as err:  # noqa: BLE001 (loaded; what stops its step here is the rest of the verdict)
        return {"status": "load", "load": record, "reason": f"its step fails at {_engine_frame(err)}: "
                                                             f"{one_line(err)[:200]}"}
    draft_ids = logits.argmax(-1)
    result = {"status": "loaded", "logits": logits, "token_ids": hot[draft_ids] if hot is not None else draft_ids,
              "hidden": fed_back.float(), "draft_vocab": hot is not None, "load": record}
    if shift:
        result["from_position_0"] = {"logits": _sglang_forward(draft, next_ids, positions, states)[0],
                                     "file": record["file"]}
    if fallback:
        result["target_states"] = fallback
    return result


def _engine_frame(err: BaseException) -> str:
    """Where in SGLang's own code the failing call was made: its innermost frame under sglang/."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f"{os.sep}sglang{os.sep}" in f.filename]
    if not frames:
        return "?"
    frame = frames[-1]
    return f"{frame.filename.split(os.sep + 'sglang' + os.sep, 1)[1]}:{frame.lineno} {frame.name}"


def _sglang_target(folder: str, ids, *, eagle3: bool, aux_ids):
    """(target or None, the states the draft reads, fallback reason or None): what SGLang's class for the target
    hands its EAGLE worker (the aux states its capture hook collects, concatenated, for EAGLE-3; else the state its
    lm_head reads). If the class cannot be built or run here, transformers' target gives them (SGLang's aux id i =
    the output of layer i = HF hidden_states[i + 1])."""
    target, reason = None, None
    try:
        target, _ = _sglang_model(folder, draft=False)
    except Exception as err:  # noqa: BLE001 (why SGLang's target cannot be built here goes into the verdict)
        reason = f"SGLang's target class builds not on CPU ({one_line(err)[:160]})"
    if target is not None:
        if eagle3:  # outside the try: SGLang's refusal of the target is the result
            from sglang.srt.model_executor.model_runner_components.attention_backend_setup import \
                configure_aux_hidden_state_capture

            configure_aux_hidden_state_capture(model=target, eagle_use_aux_hidden_state=True,
                                               eagle_aux_hidden_state_layer_ids=aux_ids,
                                               dflash_use_aux_hidden_state=False, dflash_target_layer_ids=None,
                                               is_dspark=False)
        try:
            return target, _sglang_forward(target, ids, torch.arange(ids.numel()))[1], None
        except Exception as err:  # noqa: BLE001 (as above)
            reason = f"SGLang's {type(target).__name__} runs not on CPU ({one_line(err)[:160]})"
    from transformers import AutoModelForCausalLM

    hs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()(
        ids[None], output_hidden_states=True).hidden_states
    if eagle3:
        if not aux_ids:
            raise ValueError("the export names no eagle_aux_hidden_state_layer_ids and SGLang's target class, whose "
                             "default they would be, did not run")
        return target, torch.cat([hs[i + 1][0] for i in aux_ids], dim=-1), reason
    return target, hs[-1][0], reason


def _sglang_embed_and_head(target, draft, folder: str):
    """The target's embedding and lm_head weights as SGLang's worker resolves them (`resolve_draft_embed_and_head`),
    or, where its target class could not be built, as its checkpoint holds them."""
    if target is not None:
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.speculative.pp_draft_embedding import resolve_draft_embed_and_head

        return resolve_draft_embed_and_head(target_model=target, draft_model=draft, model_path=folder,
                                            revision=None, load_config=LoadConfig())
    from safetensors.torch import load_file

    weights = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        weights.update(load_file(path))
    embed = weights["model.embed_tokens.weight"]
    return embed, weights.get("lm_head.weight", embed)


RUNNERS = {"vllm": run_vllm, "speculators": run_speculators, "sglang": run_sglang}


def main() -> int:
    job = json.loads(open(sys.argv[1]).read())
    results = RUNNERS[job["engine"]](job)
    torch.save(results, job["out"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
