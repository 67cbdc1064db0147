"""The typed training config: defaults < YAML recipe < `a.b=value` overrides (draftsmith.serve.core.config.load_config).

Every hyper-parameter lives here once; the DeepSpeed JSON and the accelerate plugins are generated from it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.ranges import check_ranges
from draftsmith.serve.core.target_config import TargetConfig
from draftsmith.serve.methods import registry
from draftsmith.serve.methods.loss_kinds import DISTRIBUTION_LOSSES, POSITION_WEIGHTINGS

STRATEGIES = ("ddp", "deepspeed", "fsdp")


@dataclass
class ModelConfig:
    RANGES: ClassVar[dict[str, str]] = {"num_speculative_tokens": ">= 1", "draft_vocab_size": ">= 0",
                                        "ttt_steps": ">= 1", "medusa_num_layers": ">= 1", "aux_layer_ids": ">= 0",
                                        "draft_layers": ">= 1", "mask_token_id": ">= -1", "anchors": ">= 1",
                                        "block_size": ">= 2"}
    method: str = "eagle3"                 # a registered method (serve/methods/), e.g. eagle3|dflash|mtp
    num_speculative_tokens: int = 5        # K trained for; Medusa: number of heads; P-EAGLE: depths a forward
    draft_vocab_size: int = 0              # 0 = the target's whole vocabulary (EAGLE-1 always uses it)
    aux_layer_ids: list[int] = field(default_factory=list)  # EAGLE-3; empty = serve.core.layers.default_eagle3_layers
    ttt_steps: int = 7                     # EAGLE-3 training-time-test unroll
    fc_norm: bool = False                  # EAGLE-3, P-EAGLE: an RMSNorm per aux feature before fc (EAGLE-3.1)
    norm_before_fc: bool = False           # EAGLE-3, P-EAGLE: one RMSNorm over the concatenated aux features before fc
    norm_output: bool = False              # EAGLE-3: the next draft step reads the normed output (EAGLE-3.1)
    block_size: int = 8                    # DFlash: tokens per block: the last verified one, then block_size-1 drafted
    draft_layers: int = 1                  # DFlash: decoder layers of the drafter
    mask_token_id: int = -1                # DFlash, P-EAGLE: the token filling the drafted slots; -1 = the tokenizer's
                                           # mask, pad, unk or eos token, the first it has (train says which)
    anchors: int = 32                      # DFlash, P-EAGLE: blocks trained per row and step (random anchors)
    fc_bias: bool = False                  # EAGLE-1
    medusa_num_layers: int = 1             # ResBlocks per Medusa head
    attn_implementation: str = "sdpa"      # sdpa | eager
    init_from: str = ""                    # a drafter folder to continue from (e.g. refreshed on served traffic):
                                           # its architecture, draft vocabulary and weights; "" = a fresh head
    shipped_drafter: str = ""              # a drafter shipped beside the target, in the form its method reads
                                           # (a transformers folder), to start from; "" = a fresh one


@dataclass
class DataConfig:
    RANGES: ClassVar[dict[str, str]] = {"max_length": ">= 2", "max_rows": ">= 0", "eval_rows": ">= 0",
                                        "vocab_rows": ">= 0"}
    mode: str = "online"                   # online: the target computes features in the step; offline: from the cache
    dataset: str = ""                      # `draftsmith data build` output (save_to_disk folder); online mode
    cache: str = ""                        # `draftsmith data capture` output; offline mode
    max_length: int = 2048                 # longer rows are cut
    max_rows: int = 0                      # 0 = all rows
    eval_rows: int = 32                    # held out from training, for top-1 agreement
    eval_dataset: str = ""                 # a held-out set of its own (online: a `data build` folder) instead
    eval_cache: str = ""                   # ... (offline: a `data capture` folder); all its rows are evaluated
    vocab_rows: int = 0                    # rows counted to pick the draft vocabulary; 0 = all training rows
    allow_other_target: bool = False       # data made for another target of the same tokenizer and hidden size
                                           # (this one is a fine-tune of it) is used, not refused (data/made_for.py)


@dataclass
class OptimConfig:
    RANGES: ClassVar[dict[str, str]] = {"lr": ">= 0", "weight_decay": ">= 0", "beta1": "[0, 1)", "beta2": "[0, 1)",
                                        "max_grad_norm": ">= 0", "batch_size": ">= 1", "grad_accum": ">= 1",
                                        "epochs": ">= 1", "max_steps": ">= 0", "max_seconds": ">= 0",
                                        "warmup_steps": ">= 0",
                                        "early_stop_patience": ">= 0"}
    lr: float = 1e-4                       # 0 = the weights stay as they start (a refresh that changes nothing)
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    max_grad_norm: float = 0.5             # 0 = no clipping
    batch_size: int = 1                    # rows per process per micro-batch
    grad_accum: int = 1
    epochs: int = 1
    max_steps: int = 0                     # optimizer steps; 0 = epochs over the training rows
    max_seconds: float = 0.0               # wall-clock budget: the loop times its first steps and fits its length
                                           # (and the lr schedule) into it, stopping there at the latest; 0 = off
    warmup_steps: int = 0
    schedule: str = "cosine"               # cosine | linear | constant (after warmup)
    keep_best: bool = True                 # with log.eval_every: save the head of the best held-out evaluation
    early_stop_patience: int = 0           # with log.eval_every: stop after N evaluations without progress; 0 = off


@dataclass
class LossConfig:
    RANGES: ClassVar[dict[str, str]] = {"decay": "(0, 1]", "feature_weight": ">= 0", "ce_weight": ">= 0",
                                        "feature_noise": ">= 0", "aux_noise": ">= 0", "prompt_weight": "[0, 1]",
                                        "lk_eta": ">= 0", "dpace_smoothing": "[0, 1]"}
    decay: float = 0.8                     # weight decay^i of TTT step / Medusa head i
    feature_weight: float = 1.0            # EAGLE-1 SmoothL1 on the next feature
    ce_weight: float = 0.1                 # EAGLE-1 cross-entropy vs the target's distribution
    feature_noise: float = 0.1             # EAGLE-1: U(-a, a) added to input features; 0 = off
    aux_noise: float = 0.0                 # EAGLE-3: U(-a, a) x the feature's RMS added to each aux feature
    prompt_weight: float = 0.0             # EAGLE-1/3: weight of prompt (non-assistant) positions; 0 = assistant only
    kind: str = "ce"                       # EAGLE-1/3: the loss against the target's distribution: ce (soft
                                           # cross-entropy) | tv (1 - acceptance) | nla (-log acceptance) | lk_hybrid
    lk_eta: float = 3.0                    # lk_hybrid: KL weight exp(-lk_eta * acceptance), the rest on 1 - acceptance
    position_weighting: str = "decay"      # EAGLE-3, DFlash: decay (decay^i) | dpace (D-PACE, from the acceptance)
    dpace_smoothing: float = 0.5           # dpace: s = (1 - smoothing) * acceptance + smoothing (D-PACE's alpha)


@dataclass
class DistributedConfig:
    RANGES: ClassVar[dict[str, str]] = {"zero_stage": "[2, 3]"}
    strategy: str = "ddp"                  # ddp | deepspeed | fsdp (single process: plain)
    zero_stage: int = 2                    # deepspeed: 2 or 3
    offload_optimizer: bool = False        # deepspeed: optimizer states on CPU
    precision: str = "auto"                # auto = bf16 on GPU, fp32 on CPU; or fp32 | bf16
    backend: str = "auto"                  # process group: auto = nccl on GPU, gloo on CPU


@dataclass
class LogConfig:
    RANGES: ClassVar[dict[str, str]] = {"every": ">= 1", "eval_every": ">= 0", "eval_positions": ">= 0",
                                        "train_eval_rows": ">= 0"}
    every: int = 10                        # steps between JSONL / wandb records
    eval_every: int = 0                    # steps between held-out evaluations; 0 = at the end only
    eval_positions: int = 0                # drafted positions evaluated; 0 = K
    train_eval_rows: int = 16              # training rows evaluated beside the held-out ones (over-fitting shows)
    progress: bool = True                  # tqdm bar on the console
    wandb_project: str = "draftsmith"
    run_name: str = ""


@dataclass
class CheckpointConfig:
    RANGES: ClassVar[dict[str, str]] = {"every": ">= 0", "keep": ">= 1"}
    every: int = 100                       # optimizer steps between checkpoints; 0 = none
    keep: int = 2                          # newest checkpoints kept
    resume: bool = True                    # continue from the newest checkpoint in out_dir


@dataclass
class TrainConfig:
    # `target=PATH` and `device=cpu` of earlier versions keep working (draftsmith.serve.core.config.load_config)
    ALIASES: ClassVar[dict[str, str]] = {"target": "target.spec", "device": "target.device"}
    RANGES: ClassVar[dict[str, str]] = {"seed": ">= 0"}
    # device auto = cuda if available, else cpu; dtype auto = distributed.precision
    target: TargetConfig = field(default_factory=lambda: TargetConfig(dtype="auto"))
    out_dir: str = "runs/drafter"
    seed: int = 0
    tracking: str = "wandb"                # wandb (offline without an API key) | none
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def validate(self) -> None:
        """Value checks, when the config is built; `check` also wants the data named (before training)."""
        check(self, data=False)


def precision_on(config: TrainConfig, device: str) -> str:
    """The compute precision of a run on `device` (cuda | cpu): distributed.precision, where `auto` is bf16 on a GPU
    and fp32 on a CPU. The one rule: training resolves it for the device it runs on, `--plan` for the devices it
    describes (train/plan.py), so both say the same for the same device."""
    if config.distributed.precision != "auto":
        return config.distributed.precision
    return "bf16" if device.startswith("cuda") else "fp32"


def _choice(name: str, value: str, allowed) -> None:
    if value not in allowed:
        raise DraftsmithError(f"{name}={value!r} is not one of {', '.join(allowed)}")


def check(config: TrainConfig, *, data: bool = True) -> TrainConfig:
    """Values the type system cannot check (and, with `data`, that the data to train on is named); raises
    DraftsmithError naming the key."""
    check_ranges(config)  # every number finite and in its range (the RANGES above)
    config.target.validate()
    if config.target.dtype != "auto":
        raise DraftsmithError(f"target.dtype={config.target.dtype}: training runs the target in "
                              f"distributed.precision; set that (fp32 | bf16) and leave target.dtype=auto")
    method = registry.method(config.model.method, what="model.method", trained=True)
    _choice("data.mode", config.data.mode, ("online", "offline"))
    _choice("distributed.strategy", config.distributed.strategy, STRATEGIES)
    _choice("distributed.precision", config.distributed.precision, ("auto", "fp32", "bf16"))
    _choice("distributed.backend", config.distributed.backend, ("auto", "gloo", "nccl"))
    _choice("optim.schedule", config.optim.schedule, ("cosine", "linear", "constant"))
    _choice("tracking", config.tracking, ("wandb", "none"))
    _choice("loss.kind", config.loss.kind, DISTRIBUTION_LOSSES)
    _choice("loss.position_weighting", config.loss.position_weighting, POSITION_WEIGHTINGS)
    _choice("model.attn_implementation", config.model.attn_implementation, ("sdpa", "eager"))
    if data and config.data.mode == "online" and not config.data.dataset:
        raise DraftsmithError("data.mode=online needs data.dataset (a `draftsmith data build` folder)")
    if data and config.data.mode == "offline" and not config.data.cache:
        raise DraftsmithError("data.mode=offline needs data.cache (a `draftsmith data capture` folder)")
    _check_options(config.model, method)
    if config.loss.position_weighting not in method.position_weightings:
        raise DraftsmithError(f"loss.position_weighting={config.loss.position_weighting}: {method.title} weighs its "
                              f"positions by {' | '.join(method.position_weightings)} (D-PACE weighs the positions of "
                              f"one drafted chain or block: EAGLE-3's steps, DFlash's slots)")
    method.check(config)
    if config.model.fc_norm and config.model.norm_before_fc:
        raise DraftsmithError("model.fc_norm (a norm per aux feature) and model.norm_before_fc (one norm over their "
                              "concatenation) exclude each other, as in vLLM, SGLang and speculators: pick one")
    if config.data.eval_cache and config.data.mode != "offline":
        raise DraftsmithError("data.eval_cache is read in offline mode; online training takes data.eval_dataset")
    if config.data.eval_dataset and config.data.mode != "online":
        raise DraftsmithError("data.eval_dataset is read in online mode; offline training takes data.eval_cache")
    return config


def _check_options(model: ModelConfig, method: registry.Method) -> None:
    """A model.* option that only other methods read, set on this recipe: refused rather than silently ignored."""
    for other in registry.names(trained=True):
        owner = registry.method(other)
        for key in owner.options:
            if owner is not method and key not in method.options and \
                    getattr(model, key) != getattr(ModelConfig, key, None):
                raise DraftsmithError(f"model.{key} is an option of {owner.title} (model.method={owner.name}), "
                                      f"not of model.method={method.name}")
