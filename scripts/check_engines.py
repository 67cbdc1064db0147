"""Engine conformance: do the engines' own loaders read our exports as our heads draft? (a developer's check,
run before changing an export, like a benchmark; never in CI, never a dependency of the project)

    .venv/bin/python scripts/check_engines.py [--engines vllm==0.33.0,vllm==0.32.0,speculators==0.9.0,sglang==0.5.23]
                                              [--families llama,qwen2,...] [--methods eagle3,mtp,...]
                                              [--exporter-repo DIR] [--work DIR] [--json FILE]

1. Installs each engine's released wheel with `--no-deps` into its own virtual environment OUTSIDE the
   repository, ~/.cache/draftsmith/engines/<name>-<version> (wheels cached in .../engines/wheels; a few small
   pure-Python modules the engine imports are added the same way, see EXTRAS), which sees the project's
   environment (torch, transformers) through a .pth file: never the reverse.
2. For every target family (`--families`, default all of tests/tiny_models.py) builds a tiny 4-layer target and
   seeded random-weight drafters for every method and vocabulary (`--methods`, default all: EAGLE-1 full; EAGLE-3
   and Medusa full and reduced; Medusa for Llama only, see FAMILY_FREE; MTP, on a target that ships a random MTP
   layer where the family's real checkpoints ship one), and exports each in every format with draftsmith's
   exporter (`--exporter-repo` picks another checkout's exporter, e.g. an older commit, for a before/after). A
   combination the exporter refuses (an engine whose target class cannot host the draft) is reported as such.
3. Runs scripts/engine_worker.py inside each engine environment: the engine's config readers, draft-model
   classes and `load_weights` load the folder, the engine's own class for the family's target computes the aux
   hidden states, and one teacher-forced draft step runs (stand-ins only for what needs a GPU: see
   engine_worker.py, which says in the verdict when the target's states came from transformers instead). An MTP
   export (a copy of the target's checkpoint with the drafter's layer merged in) is served as the target itself:
   vLLM `method: mtp` with no draft model, the architecture its SpeculativeConfig maps the checkpoint to, loaded
   by its DefaultModelLoader; the verdict names that mapping, the class's file and the parameters the class's
   load_weights left unfilled (the loader's own check passes an unquantized model's linear and embedding layers).
   SGLang runs as its CPU engine: its ModelConfig (NEXTN: the draft class it maps the served checkpoint to),
   DefaultModelLoader and classes, its target class handing the draft the states it captures. Each SGLang verdict
   says which of the folder's tensors (a merged folder: of the drafter's layer) the class read and which parameters
   it left unfilled. A draft whose step reads the target's keys and values from the engine's KV cache (the Gemma 4
   assistant, vLLM's gemma4_mtp and SGLang's FROZEN_KV_MTP; SGLang's DFlash) is loaded, not stepped; a step that
   needs a kernel with no CPU path stops at the load verdict, naming the kernel and where SGLang calls it.
4. Compares that step with our head's: logits over the target vocabulary, the token ids after d2t, and the
   state fed back; prints family x format x method x vocabulary x engine -> loads / drafts identically / fails
   (error), and with `--json FILE` writes those rows.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from draftsmith.serve.core.families import tiny_families

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("DRAFTSMITH_CACHE", Path.home() / ".cache" / "draftsmith")) / "engines"
DEFAULT_ENGINES = "vllm==0.34.0,vllm==0.32.0,speculators==0.9.0,sglang==0.5.23"
# Pure-Python (or small) modules the engines import on the code paths run here, installed with --no-deps too.
EXTRAS = {
    "vllm": ["pyzmq", "cbor2", "aiohttp", "multidict", "attrs", "yarl", "propcache", "aiohappyeyeballs",
             "aiosignal", "frozenlist", "openai-harmony", "pybase64", "cachetools", "msgspec", "cloudpickle",
             "uvloop", "xgrammar", "apache-tvm-ffi", "llguidance", "partial-json-parser",
             "compressed-tensors", "loguru"],  # the last two: vLLM >= 0.34's quantization imports (Qwen3.5's GDN)
    "speculators": ["hs-connectors==0.9.0", "loguru", "pydantic-settings", "python-dotenv"],
    "sglang": ["orjson", "pyzmq", "aiohttp", "multidict", "attrs", "yarl", "propcache", "aiohappyeyeballs",
               "aiosignal", "frozenlist", "msgspec", "pybase64",
               # SGLang's import path: sglang.srt.utils imports triton (a 290 MB wheel, found in .../engines/wheels
               # first); its quantization registry compressed-tensors (which imports loguru); its kernel ops
               # apache-tvm-ffi; its function-call parsers partial-json-parser (the pins are sglang 0.5.23's)
               "triton==3.9.0", "compressed-tensors==0.18.0", "loguru", "apache-tvm-ffi==0.1.11",
               "partial-json-parser"],
}
FORMATS_OF = {"vllm": ("vllm", "speculators"), "speculators": ("speculators",), "sglang": ("sglang",)}
# tests/tiny_models.py's families (gemma = gemma3_text), as the family table names them
FAMILIES = tiny_families()
# heads without a decoder layer (Medusa) read only the target's last hidden state and share nothing else with it: the
# family does not change what the engine loads, so one family is enough
FAMILY_FREE = ("llama",)


def cases(only: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(method, full | reduced vocabulary) of every registered method with an engine form (`only`: of those)."""
    from draftsmith.serve.methods.registry import method, names

    return [(name, vocab) for name in names(trained=True) if formats(method(name)) and (not only or name in only)
            for vocab in (("full", "reduced") if method(name).own_vocab else ("full",))]


def formats(method) -> tuple[str, ...]:
    """The formats a method's drafters are exported in here: its forms, or, for a method merged into the target's
    own checkpoint (MTP), every format (those it cannot carry are refused by the exporter, and said so)."""
    from draftsmith.serve.export.formats import FORMATS

    return tuple(method.exports) or (tuple(FORMATS) if method.merge_export else ())


def merged(folder: Path, target_dir: Path) -> bool:
    """Whether an export is a copy of the target's checkpoint with the draft layer in it (MTP), served as the target
    itself, rather than a draft model beside it (an EAGLE folder, the Gemma 4 assistant's): its architectures are
    the target's."""
    architectures = [json.loads((d / "config.json").read_text()).get("architectures") for d in (folder, target_dir)]
    return architectures[0] == architectures[1]


def family_bound(method) -> bool:
    """Whether what the engine loads depends on the target's family: a Llama decoder layer configured from it, or a
    layer of the family merged into its checkpoint (Medusa's heads share nothing with it)."""
    return method.llama_layer or method.merge_export is not None


REDUCED = 150  # draft vocabulary of the reduced drafters (the tiny target has 259 tokens)
PARALLEL_SLOTS = 2  # P-EAGLE's mask slots after the teacher-forced pairs (as engine_worker.py's step)


# --------------------------------------------------------------------------------------- environments

def _pip(*args: str) -> None:
    """pip, finding the wheels cached in .../engines/wheels before the index's."""
    subprocess.run([sys.executable, "-m", "pip", "-q", *args, "--find-links", str(CACHE / "wheels")], check=True)


def ensure_env(name: str, version: str) -> Path:
    """~/.cache/draftsmith/engines/NAME-VERSION: a venv holding the engine's wheel (--no-deps) and EXTRAS."""
    env = CACHE / f"{name}-{version}"
    python = env / "bin" / "python"
    site = env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    ready = f"{name}=={version}\n{' '.join(EXTRAS[name])}\n"
    if (env / ".ready").is_file():
        if (env / ".ready").read_text() != ready:  # EXTRAS grew since this environment was made
            _pip("install", "--no-deps", "--upgrade", "--target", str(site), *EXTRAS[name])
            (env / ".ready").write_text(ready)
        return python
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob(f"{name}-{version}-*.whl")):
        _pip("download", "--no-deps", "-d", str(wheels), f"{name}=={version}")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    # the project's packages (torch, transformers, ...) are visible after the engine's own
    (site / "zz_draftsmith_env.pth").write_text(
        f"import site; site.addsitedir({str(Path(sys.prefix) / site.relative_to(env))!r})\n")
    wheel = next(wheels.glob(f"{name}-{version}-*.whl"))
    _pip("install", "--no-deps", "--target", str(site), str(wheel), *EXTRAS[name])
    (env / ".ready").write_text(ready)
    return python


# ------------------------------------------------------------------------------------ drafters, exports

def make_drafters(work: Path, family: str, head_options: dict | None = None,
                  methods: tuple[str, ...] = ()) -> tuple[Path, dict]:
    """The family's tiny target and one seeded native drafter per (method, vocabulary); `head_options` (model.*
    keys, e.g. norm_output=True) are set on the drafters of the methods that have them. A family whose real
    checkpoints ship an MTP layer (tests/mtp_fixtures.py) gets a target that ships a random one, as theirs do: an
    MTP drafter's export replaces it (and the engines must read the drafter's layer, not the shipped one)."""
    sys.path.insert(0, str(ROOT))
    from draftsmith.serve.core.target import load_target
    from tests.export_fixtures import make_native
    from tests.mtp_fixtures import MTP_COUNT, save_mtp_target
    from tests.tiny_models import save_tiny_target

    target_dir = (save_mtp_target(work / "target", family) if family in MTP_COUNT
                  else save_tiny_target(work / "target", family, num_hidden_layers=4))
    as_released(target_dir)
    target = load_target(str(target_dir))
    natives = {}
    from draftsmith.serve.methods.registry import method as method_of

    for method, vocab in cases(methods):
        if not family_bound(method_of(method)) and family not in FAMILY_FREE:
            continue
        options = {"draft_vocab_size": None if vocab == "full" else REDUCED} if method_of(method).own_vocab else {}
        options.update({k: v for k, v in (head_options or {}).items() if k in method_of(method).options})
        try:
            natives[method, vocab] = make_native(target, method, work / "native" / f"{method}-{vocab}", seed=7,
                                                 **options)
        except ValueError as err:  # a method whose random drafters are not made here (the Gemma 4 assistant)
            print(f"check_engines: {family} {method}: skipped ({err})", file=sys.stderr)
    return target_dir, natives


def as_released(target_dir: Path) -> None:
    """The tiny target's config.json in the form the family's released checkpoints ship it (which an MTP export
    copies), where transformers writes another that SGLang 0.5.23's config readers refuse: DeepSeek-V3's and V3.2's
    `moe_layer_freq` (its deepseek_v2.py reads it; transformers writes none), Nemotron-H's layer patterns as
    NVIDIA's letters (`hybrid_override_pattern`; its NemotronHConfig refuses transformers' `layers_block_type`
    names). transformers reads either form."""
    from transformers import NemotronHConfig

    path = target_dir / "config.json"
    config = json.loads(path.read_text())
    if config["model_type"] in ("deepseek_v3", "deepseek_v32"):
        config.setdefault("moe_layer_freq", 1)
    if config["model_type"] == "nemotron_h":
        for types, pattern in (("layers_block_type", "hybrid_override_pattern"),
                               ("mtp_layers_block_type", "mtp_hybrid_override_pattern")):
            if types in config:
                config[pattern] = NemotronHConfig._list_to_pattern(config.pop(types))  # noqa: SLF001
    path.write_text(json.dumps(config, indent=2) + "\n")


# One process per family exports every (drafter, format): it imports the exporter of --exporter-repo, not ours.
# `draftsmith` is made that checkout's package before anything imports it (scripts/ is the package, its other
# folders are draftsmith.serve, ...); a checkout from before the one namespace is imported by its folders' names.
CHECKOUT_PACKAGE = textwrap.dedent("""
    import sys, types
    package = types.ModuleType("draftsmith")
    package.__path__ = [sys.argv[3] + "/scripts", sys.argv[3]]
    sys.modules["draftsmith"] = package
""")
EXPORT_FAMILY = textwrap.dedent("""
    import json, sys
    import torch
    from draftsmith.serve.export import export_drafter
    from draftsmith.serve.export.common import default_prompts
    from draftsmith.serve.core.target import load_target
    torch.set_num_threads(1)
    target_dir, jobs = sys.argv[1], json.loads(sys.argv[2])
    target = load_target(target_dir)
    prompts = default_prompts(target, count=1)
    for native, fmt, out in jobs:
        try:
            export_drafter(native, fmt, out, target=target, prompts=prompts, k=3, max_new_tokens=8)
            result = {"ok": True}
        except Exception as err:
            result = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        print(json.dumps({"out": out, **result}), flush=True)
""")


def export_all(natives: dict, target_dir: Path, work: Path, exporter_repo: Path) -> dict:
    """(fmt, method, vocab) -> folder, or the exporter's refusal (its first line)."""
    from draftsmith.serve.methods.registry import method as method_of

    jobs = {(fmt, method, vocab): (str(native), fmt, str(work / "exports" / f"{fmt}-{method}-{vocab}"))
            for (method, vocab), native in natives.items()
            for fmt in formats(method_of(method))}
    namespaced = (exporter_repo / "scripts" / "__main__.py").is_file()
    code = CHECKOUT_PACKAGE + EXPORT_FAMILY if namespaced else EXPORT_FAMILY.replace("from draftsmith.", "from ")
    proc = subprocess.run([sys.executable, "-c", code, str(target_dir), json.dumps(list(jobs.values())),
                           str(exporter_repo)],
                          cwd=exporter_repo, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(exporter_repo)})
    done = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            done[result["out"]] = result
    crash = {"ok": False, "error": f"exporter process: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}"}
    out = {}
    for key, (_, _, folder) in jobs.items():
        result = done.get(folder, crash)
        out[key] = Path(folder) if result["ok"] else result["error"].splitlines()[0][:300]
    return out


# ------------------------------------------------------------------------------------------ reference

def reference_steps(natives: dict, target_dir: Path, input_ids) -> dict:
    """Our head's teacher-forced step: logits over the target vocabulary, target ids, the state fed back."""
    import torch

    from draftsmith.serve.drafters.draft_layer import shared_embedding
    from draftsmith.serve.core.layers import FINAL
    from draftsmith.serve.drafters.folder import load_head
    from draftsmith.serve.drafters.masks import additive, causal_allowed
    from draftsmith.serve.drafters.vocab import draft_token_ids
    from draftsmith.serve.methods.registry import method as method_of
    from draftsmith.serve.core.target import load_target

    target = load_target(str(target_dir))
    next_ids = torch.cat([input_ids[1:], input_ids[-1:]])
    with torch.no_grad():
        hs = target.model(input_ids[None], output_hidden_states=True).hidden_states
        features = {i: hs[i + 1][0] for i in range(len(hs) - 1)}
        features[FINAL] = hs[-1][0]
        refs = {}
        for key, native in natives.items():
            head = load_head(native).eval()
            config = head.config
            if "shared_kv_states" in inspect.signature(head.forward).parameters:  # drafts from the target's keys
                continue  # and values (the Gemma 4 assistant): the engines' classes are loaded, not stepped
            vocab = config.vocab_size
            if hasattr(head, "context_kv"):  # DFlash: one block [the last token, masks] after the whole context
                block, length = config.block_size, input_ids.numel()
                context_kv = head.context_kv(head.context(features)[None], torch.arange(length)[None])
                tokens = torch.full((block,), config.mask_token_id)
                tokens[0] = input_ids[-1]
                embeds = shared_embedding(target)(tokens)[None]
                mask = torch.zeros(1, 1, block, length + block)
                out = head(embeds, torch.arange(length, length + block)[None], context_kv, mask)[0, 1:]
                fed_back = out
                logits = target.model.get_output_embeddings()(out)
            elif not family_bound(method_of(config.method)):  # independent heads on the final state (Medusa)
                logits = head(features[FINAL])  # (heads, T, Vd)
                fed_back = torch.stack([block(features[FINAL]) for block in head.blocks])
            else:
                hidden, tokens = head.input_hidden(features), next_ids
                if hasattr(head, "mask_input"):  # P-EAGLE: mask slots after the pairs, as the engine's proposer
                    hidden = torch.cat([hidden, head.mask_input().expand(PARALLEL_SLOTS, -1)])
                    tokens = torch.cat([tokens, torch.full((PARALLEL_SLOTS,), config.mask_token_id)])
                length = tokens.numel()
                embeds = shared_embedding(target)(tokens)[None]
                mask = additive(causal_allowed(length, 0), torch.float32)[None]
                out = head(hidden[None], embeds, position_ids=torch.arange(length)[None], attention_mask=mask)
                fed_back = out[0]
                lm_head_input = getattr(head, "lm_head_input", None) or (lambda x: x)  # as EagleDrafter (MTP: norm)
                logits = (target.model.get_output_embeddings()(lm_head_input(out))
                          if getattr(head, "reads_target_lm_head", False) else head.logits(out))[0]
                head_input = lm_head_input(out)[0]  # MTP: what the lm_head reads (an engine may feed it back)
            ids = draft_token_ids(head.d2t) if hasattr(head, "d2t") else torch.arange(vocab)
            full = logits.new_full((*logits.shape[:-1], vocab), float("-inf"))
            full[..., ids] = logits
            refs[key] = {"logits": full, "draft_logits": logits, "token_ids": ids[logits.argmax(-1)],
                         "hidden": fed_back}
            if getattr(head, "reads_target_lm_head", False) and hasattr(head, "lm_head_input"):
                refs[key]["head_input"] = head_input
    return refs


def load_verdict(load: dict) -> str:
    """What SGLang's DefaultModelLoader and the class's load_weights did with a folder (engine_worker's record)."""
    own = load.get("own")  # a merged folder: the drafter's layer (model-mtp.safetensors); the target's others
    tensors = own or load["tensors"]
    unread = [name for name in load["unread"] if name in tensors]
    parts = [f"{load['class']} ({load['file']}) read {len(tensors) - len(unread)} of {len(tensors)} "
             + ("tensors of the drafter's layer" if own else "tensors")
             + (f" (unread: {', '.join(unread[:6])})" if unread else "")]
    unfilled, after = load["unfilled"], load.get("unfilled_shared", load["unfilled"])
    if not unfilled:
        parts.append(f"all {load['parameters']} parameters filled")
    else:
        shared = sorted(set(unfilled) - set(after))
        parts.append(f"{len(unfilled)} of {load['parameters']} parameters not in the folder"
                     + (f" ({', '.join(shared)}: the target's, put there by the EAGLE worker)" if shared else "")
                     + (f"; unfilled: {', '.join(after[:4])}" if after else ""))
    if load.get("partly"):  # rows the class builds and its load_weights has nothing for
        parts.append(f"filled in part: {', '.join(load['partly'][:4])}")
    return ", ".join(parts)


def _close(a, b) -> bool:
    import torch

    return a.shape == b.shape and torch.allclose(a.to(b.dtype), b, atol=1e-4, rtol=1e-4)


def compare(ref: dict, got: dict) -> str:
    import torch

    if got["status"] == "load":  # loaded by the engine; its step needs what is not stood in here
        return f"loads: {load_verdict(got['load'])}; step not run ({got['reason']})"
    if got["status"] != "loaded":
        return f"fails: {got['error']}"
    logits = ref["draft_logits"] if got.get("draft_vocab") else ref["logits"]
    theirs = got["logits"].to(logits.dtype)
    problems = []
    if theirs.shape != logits.shape:
        problems.append(f"logits shape {list(theirs.shape)} != ours {list(logits.shape)}")
    else:
        finite = torch.isfinite(logits)
        if not torch.equal(finite, torch.isfinite(theirs)):
            problems.append("logits -inf elsewhere than ours (draft vocabulary mapped differently)")
        elif not torch.allclose(theirs[finite], logits[finite], atol=1e-4, rtol=1e-4):
            problems.append(f"logits differ (max |diff| {float((theirs[finite] - logits[finite]).abs().max()):.3g})")
    if not torch.equal(got["token_ids"].long(), ref["token_ids"].long()):
        problems.append(f"token ids differ at {int((got['token_ids'].long() != ref['token_ids'].long()).sum())} of "
                        f"{ref['token_ids'].numel()} positions")
    hidden = got["hidden"].to(ref["hidden"].dtype)
    if not _close(hidden, ref["hidden"]):
        problems.append("state fed back differs" + (
            " (the engine feeds back the normed output its lm_head reads; our head, norm_output false, the layer's)"
            if "head_input" in ref and _close(hidden, ref["head_input"]) else ""))
    verdict = "loads, drafts differently: " + "; ".join(problems) if problems else "loads, drafts identically"
    if theirs.shape == logits.shape and not any(p.startswith("logits") for p in problems):  # the tolerance is 1e-4
        finite = torch.isfinite(logits)
        verdict += f" (max |logit diff| {float((theirs[finite] - logits[finite]).abs().max()):.2g})"
    if "from_position_0" in got:  # the compared step ran from position 1: the engine's layer zeroes position 0
        early = got["from_position_0"]
        diff = (early["logits"].to(logits.dtype) - ref["logits"]).abs()[torch.isfinite(ref["logits"])]
        verdict += (f"; compared at positions 1..T: from position 0 the engine's layer ({early['file']}) zeroes "
                    f"that token's embedding and our head does not (max |logit diff| {float(diff.max()):.2g} there)")
    if "window_plus_one" in got:  # a sliding-window MTP layer: vLLM's window against ours (the layer's + 1 key)
        wider = got["window_plus_one"]
        diff = (wider["logits"].to(logits.dtype) - ref["logits"]).abs()[torch.isfinite(ref["logits"])]
        verdict += (f"; its sliding windows hold {wider['window']} keys, the query's own included (flash-attention's "
                    f"(W - 1, 0)); with every window one key wider (the target's too) its step "
                    + ("matches ours" if float(diff.max()) <= 1e-4 else "still differs from ours")
                    + f" (max |logit diff| {float(diff.max()):.2g})")
    if got.get("target_states"):  # the engine's target class could not run here: say whose states the draft read
        verdict += f" (draft checked with HF target states: {got['target_states']})"
    if "load" in got:  # SGLang: what its loader did with the folder
        verdict += f"; {load_verdict(got['load'])}"
    if "serve_dir" in got:  # speculators format in vLLM: the `vllm serve OUT` form too
        verdict += f"; `vllm serve OUT` {got['serve_dir']}"
    if "reads" in got:  # a merged checkpoint: what the engine mapped it to
        reads = got["reads"]
        unfilled = reads.get("unfilled", [])
        shared = all(name.endswith("shared_head.head.weight") for name in unfilled)  # the proposer's to fill
        filled = (f"its load_weights filled all {reads['parameters']} parameters" if not unfilled else
                  f"its load_weights left {len(unfilled)} of {reads['parameters']} parameters unfilled "
                  f"({', '.join(unfilled[:4])}; DefaultModelLoader's check exempts an unquantized model's linear "
                  f"and embedding layers" + ("; vLLM's proposer puts the target's lm_head there)" if shared else ")"))
        verdict += (f"; method mtp maps {reads['served_arch']} to {reads['arch']} ({reads['model_type']}; registry "
                    f"{reads['entry']}, built here from {reads['file']}); {filled}")
    return verdict


# ------------------------------------------------------------------------------------------------ main

def run_engine(python: Path, engine: str, cases: list[dict], inputs: Path, work: Path) -> dict:
    """One worker process per engine runs every family's cases (each case names its target)."""
    import torch

    job = work / f"job-{engine}-{os.getpid()}.json"
    out = work / f"result-{engine}-{os.getpid()}.pt"
    job.write_text(json.dumps({"engine": engine, "inputs": str(inputs), "out": str(out), "cases": cases}))
    proc = subprocess.run([str(python), str(ROOT / "scripts" / "engine_worker.py"), str(job)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0 or not out.is_file():
        error = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {c["name"]: {"status": "failed", "error": f"worker: {error}"} for c in cases}
    return torch.load(out, weights_only=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=DEFAULT_ENGINES, help=f"comma-separated name==version (default "
                                                                  f"{DEFAULT_ENGINES})")
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated target families of "
                                                                         f"tests/tiny_models.py (default: all, "
                                                                         f"{','.join(FAMILIES)})")
    parser.add_argument("--exporter-repo", default=str(ROOT), help="the draftsmith checkout whose exporter writes "
                                                                    "the folders (default: this one)")
    parser.add_argument("--methods", default="", help="comma-separated methods to check (default: every method "
                                                      "with an engine form)")
    parser.add_argument("--work", default="", help="work folder (default: a temporary one)")
    parser.add_argument("--json", default="", help="also write the table as JSON here")
    parser.add_argument("--head-options", default="", help="comma-separated model.* options set on the drafters "
                                                           "of the methods that have them, e.g. norm_output=true "
                                                           "(EAGLE-3.1) or fc_norm=true: check that option's export")
    args = parser.parse_args(argv)
    head_options = _head_options(args.head_options, parser)

    import torch

    torch.set_num_threads(1)
    work = Path(args.work or tempfile.mkdtemp(prefix="draftsmith-engines-"))
    work.mkdir(parents=True, exist_ok=True)
    engines = [tuple(spec.split("==")) for spec in args.engines.split(",") if spec]
    families = [f for f in args.families.split(",") if f]
    sys.path.insert(0, str(ROOT))
    from tests.tiny_models import HYBRID_FAMILIES  # asked for by name: hybrid targets and Gemma 4

    known = [*FAMILIES, *HYBRID_FAMILIES]
    unknown = sorted(set(families) - set(known))
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(known)}")
    methods = tuple(m for m in args.methods.split(",") if m)
    exported = {m for m, _ in cases()}
    if set(methods) - exported:
        parser.error(f"--methods {sorted(set(methods) - exported)}: choose from {', '.join(sorted(exported))}")
    pythons = {spec: ensure_env(*spec) for spec in engines}
    input_ids = torch.arange(3, 15)
    inputs = work / "inputs.pt"
    torch.save({"input_ids": input_ids}, inputs)
    targets, exports, refs = {}, {}, {}
    for family in families:
        targets[family], natives = make_drafters(work / family, family, head_options, methods)
        for key, folder in export_all(natives, targets[family], work / family,
                                      Path(args.exporter_repo).resolve()).items():
            exports[(family, *key)] = folder
        for key, ref in reference_steps(natives, targets[family], input_ids).items():
            refs[(family, *key)] = ref

    rows = []
    for name, version in engines:
        jobs = [{"name": f"{family}-{fmt}-{m}-{v}", "family": family, "target": str(targets[family]),
                  "format": fmt, "method": m, "folder": str(folder), "merged": merged(folder, targets[family])}
                 for (family, fmt, m, v), folder in exports.items()
                 if fmt in FORMATS_OF[name] and isinstance(folder, Path)]
        results = run_engine(pythons[name, version], name, jobs, inputs, work) if jobs else {}
        for (family, fmt, method, vocab), folder in exports.items():
            if fmt not in FORMATS_OF[name]:
                continue
            verdict = (f"refused by the exporter: {folder}" if not isinstance(folder, Path)
                       else compare(refs.get((family, method, vocab)), results[f"{family}-{fmt}-{method}-{vocab}"]))
            rows.append({"family": family, "format": fmt, "method": method, "vocabulary": vocab,
                         "engine": f"{name} {version}", "result": verdict})
    columns = ("family", "format", "method", "vocabulary", "engine")
    width = {k: max(len(k), *(len(r[k]) for r in rows)) for k in columns}
    print(" | ".join(k.ljust(width[k]) for k in width) + " | result")
    for row in rows:
        print(" | ".join(row[k].ljust(width[k]) for k in width) + " | " + row["result"])
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def _head_options(text: str, parser: argparse.ArgumentParser) -> dict:
    """'norm_output=true,fc_norm=false' -> {'norm_output': True, 'fc_norm': False}: a method's on/off model.*
    options (train/config.py ModelConfig)."""
    from draftsmith.serve.methods.registry import method, names
    from draftsmith.train.config import ModelConfig

    known = {key for name in names(trained=True) for key in method(name).options
             if isinstance(getattr(ModelConfig, key, None), bool)}
    options = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in known or value.lower() not in ("true", "false"):
            parser.error(f"--head-options {item!r}: expected KEY=true|false with KEY one of {', '.join(sorted(known))}")
        options[key] = value.lower() == "true"
    return options


if __name__ == "__main__":
    sys.exit(main())
