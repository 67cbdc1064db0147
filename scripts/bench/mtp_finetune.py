"""The fine-tune story of a target's own MTP layer, end to end on a CPU: a target that ships an MTP layer is fine-tuned
on a new domain, its shipped layer loses acceptance there, and a short fine-tune of that layer wins it back.

    .venv/bin/python scripts/bench/mtp_finetune.py [--work runs/mtp_story]
        [--prompts ../shared/data/train/prompts.jsonl]
        [--per-domain 48] [--eval-per-domain 12] [--pretrain-steps 1500] [--finetune-steps 300] [--train-seconds 60]
        [--threads 1] [--json runs/bench_mtp_finetune.json]

No checkpoint small enough for this machine ships MTP layers through the package registries, so the target is made:
1. base: a tiny Qwen3.5-family target (4 full-attention layers, hidden 64, a byte tokenizer with a ChatML template)
   trained from random on chat turns cut from the prompts of every domain but the new one (--new-domain, code); its
   config names one MTP layer.
2. what it ships: `draftsmith data build` has base answer --per-domain prompts of each domain and `draftsmith train
   model.method=mtp` trains a fresh layer on the answers for --train-seconds; the layer is written into base's
   checkpoint under Qwen3.5's names (`mtp.*`), as the real checkpoints carry it.
3. the user's fine-tune: base trained --finetune-steps more on the new domain alone; its checkpoint keeps the
   shipped layer, as a fine-tune of a real checkpoint does.
4. the user's turn, through the CLI on the fine-tuned target: `data build` on the same prompts, then `train
   model.method=mtp` (which starts from the shipped layer) and `train model.method=eagle3` from scratch on the same
   rows for the same --train-seconds; `eval` on held-out prompts (rows none of the steps above read) of the
   shipped layer, the fine-tuned layer, EAGLE-3 and n-gram, K=3 every cycle, greedy; and the shipped layer on
   base itself, the acceptance the fine-tune took away.
Prints μ per domain and what the fine-tune recovered of what the shipped layer lost on the new domain.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOMAINS = ("math", "roleplay", "code")
SPLIT = 56  # characters of a prompt its user turn keeps; the assistant turn is what follows (pre-training text)


def _rows(path: Path, domains: tuple[str, ...], seed: int = 0) -> dict[str, list[dict]]:
    by_domain: dict[str, list[dict]] = {d: [] for d in domains}
    for line in path.read_text(encoding="utf-8").split("\n"):  # (a prompt may hold U+2028, a line break to Python)
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("domain") in by_domain and len(row["prompt"]) > SPLIT + 40:
            by_domain[row["domain"]].append(row)
    rng = random.Random(seed)
    for rows in by_domain.values():
        rng.shuffle(rows)
    return by_domain


def _prompt_file(path: Path, rows: list[dict]) -> Path:
    """JSONL of the rows' opening words as user prompts (what the target answers)."""
    path.write_text("".join(json.dumps({"id": r["id"], "domain": r["domain"], "prompt": r["prompt"][:SPLIT]}) + "\n"
                            for r in rows))
    return path


def _conversations(tokenizer, rows: list[dict], max_tokens: int = 192) -> list[list[int]]:
    out = []
    for r in rows:
        text = r["prompt"]
        messages = [{"role": "user", "content": text[:SPLIT]}, {"role": "assistant", "content": text[SPLIT:][:400]}]
        out.append(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)[:max_tokens])
    return out


def _train_lm(model, sequences: list[list[int]], *, steps: int, lr: float, batch: int = 8, seed: int = 0) -> float:
    """Plain causal-LM training of the target itself (what a user does elsewhere); returns the last loss."""
    import torch

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.1, 1 - s / steps))
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        picked = rng.sample(sequences, min(batch, len(sequences)))
        width = max(len(s) for s in picked)
        ids = torch.full((len(picked), width), 256, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        for i, s in enumerate(picked):
            ids[i, :len(s)] = torch.tensor(s)
            labels[i, :len(s)] = torch.tensor(s)
        loss = model(input_ids=ids, labels=labels).loss  # (the mean over the batch's tokens)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    return float(loss.detach())


def _cli(*args: str, log: Path) -> None:
    command = [str(ROOT / ".venv" / "bin" / "draftsmith"), *args]
    t0 = time.time()
    with log.open("a") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    print(f"  draftsmith {args[0]} {args[1] if len(args) > 1 and not args[1].startswith('-') else ''}"
          f"({time.time() - t0:.0f} s)", file=sys.stderr)
    if done.returncode:
        raise SystemExit(f"draftsmith {' '.join(args)} failed (exit {done.returncode}); see {log}")


def _mu(result: Path) -> dict[str, dict[str, float]]:
    data = json.loads(result.read_text())
    assert data["exactness"]["identical"] == data["exactness"]["total"], data["exactness"]
    table = {name: {domain: round(per[name]["mu"], 3) for domain, per in data["domains"].items() if name in per}
             for name in (d["name"] for d in data["drafters"])}
    for name, row in table.items():
        row["all"] = round(data["overall"][name]["mu"], 3)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="runs/mtp_story")
    parser.add_argument("--prompts", default=str(ROOT.parent / "shared" / "data" / "train" / "prompts.jsonl"))
    parser.add_argument("--new-domain", default="code")
    parser.add_argument("--per-domain", type=int, default=48)
    parser.add_argument("--eval-per-domain", type=int, default=12)
    parser.add_argument("--pretrain-rows", type=int, default=600)
    parser.add_argument("--pretrain-steps", type=int, default=1000)
    parser.add_argument("--finetune-steps", type=int, default=300)
    parser.add_argument("--train-seconds", type=float, default=60.0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default="runs/bench_mtp_finetune.json")
    args = parser.parse_args(argv)

    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from draftsmith.eval.report import write_json

    sys.path.insert(0, str(ROOT))  # the tiny targets' tokenizer and MTP writer of the tests
    from tests.mtp_fixtures import add_mtp_layer
    from tests.tiny_models import tiny_tokenizer

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "commands.log"
    rows = _rows(Path(args.prompts), DOMAINS)
    held_out = {d: r[: args.eval_per_domain] for d, r in rows.items()}
    distill = {d: r[args.eval_per_domain: args.eval_per_domain + args.per_domain] for d, r in rows.items()}
    first = args.eval_per_domain + args.per_domain
    pretrain = [r for d, rs in rows.items() if d != args.new_domain for r in rs[first: first + args.pretrain_rows]]
    finetune = rows[args.new_domain][first: first + args.pretrain_rows]
    train_prompts = _prompt_file(work / "prompts_train.jsonl", [r for rs in distill.values() for r in rs])
    eval_prompts = _prompt_file(work / "prompts_eval.jsonl", [r for rs in held_out.values() for r in rs])
    tokenizer = tiny_tokenizer()
    figures: dict = {"settings": vars(args), "seconds": {}}

    # 1. base
    base = work / "base"
    t0 = time.time()
    config = AutoConfig.for_model("qwen3_5_text", vocab_size=259, hidden_size=64, intermediate_size=192,
                                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  layer_types=["full_attention"] * 4, max_position_embeddings=1024,
                                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=258, pad_token_id=256,
                                  mtp_num_hidden_layers=1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    loss = _train_lm(model, _conversations(tokenizer, pretrain), steps=args.pretrain_steps, lr=3e-3)
    print(f"base: {args.pretrain_steps} steps in {time.time() - t0:.0f} s, loss {loss:.3f}", file=sys.stderr)
    model.generation_config.eos_token_id = 258
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    figures["seconds"]["pretrain"] = round(time.time() - t0, 1)
    figures["pretrain_loss"] = round(loss, 3)

    # 2. the MTP layer base ships
    common = ("model.num_speculative_tokens=3", "model.ttt_steps=3", "optim.batch_size=8", "optim.lr=3e-3",
              f"optim.max_seconds={args.train_seconds}", "optim.epochs=1000", "data.eval_rows=8", "tracking=none", "log.progress=false",
              "checkpoint.every=0", f"target.threads={args.threads}")
    build = ("--prompts", str(train_prompts), f"data.max_new_tokens={args.max_new_tokens}", "data.batch_size=16")
    _cli("data", "build", "--target", str(base), "--out", str(work / "data_base"), *build, log=log)
    _cli("train", "model.method=mtp", f"target={base}", f"data.dataset={work / 'data_base'}",
         f"out_dir={work / 'mtp_base'}", *common, log=log)
    add_mtp_layer(base, state=load_file(str(work / "mtp_base" / "drafter" / "model.safetensors")))

    # 3. the user's fine-tune on the new domain, keeping the shipped layer
    tuned = work / "finetuned"
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(base)
    loss = _train_lm(model, _conversations(tokenizer, finetune), steps=args.finetune_steps, lr=1e-3, seed=1)
    model.save_pretrained(tuned)
    tokenizer.save_pretrained(tuned)
    add_mtp_layer(tuned, state=load_file(str(work / "mtp_base" / "drafter" / "model.safetensors")))
    figures["seconds"]["finetune"] = round(time.time() - t0, 1)
    figures["finetune_loss"] = round(loss, 3)

    # 4. the user's turn
    _cli("data", "build", "--target", str(tuned), "--out", str(work / "data_tuned"), *build, log=log)
    for method in ("mtp", "eagle3"):
        t0 = time.time()
        _cli("train", f"model.method={method}", f"target={tuned}", f"data.dataset={work / 'data_tuned'}",
             f"out_dir={work / (method + '_tuned')}", *common, log=log)
        figures["seconds"][f"train_{method}"] = round(time.time() - t0, 1)
    evaluate = ("--prompts", str(eval_prompts), "--k", "3", "--max-new-tokens", str(args.max_new_tokens),
                "--no-peers", "--no-cost-model", "--threads", str(args.threads), "--quiet")
    _cli("eval", "--target", str(base), "--drafter", "shipped=mtp:length=fixed", *evaluate,
         "--json", str(work / "eval_base.json"), log=log)
    _cli("eval", "--target", str(tuned), "--drafter", "shipped=mtp:length=fixed",
         "--drafter", f"mtp_tuned={work / 'mtp_tuned' / 'drafter'}:length=fixed",
         "--drafter", f"eagle3={work / 'eagle3_tuned' / 'drafter'}:length=fixed",
         "--drafter", "ngram=ngram:length=fixed",
         *evaluate, "--json", str(work / "eval_tuned.json"), log=log)
    before = _mu(work / "eval_base.json")["shipped"]
    after = _mu(work / "eval_tuned.json")
    new = args.new_domain
    lost = before[new] - after["shipped"][new]
    won = after["mtp_tuned"][new] - after["shipped"][new]
    figures.update(mu_base_target={"shipped": before}, mu_finetuned_target=after,
                   lost=round(lost, 3), recovered=round(won, 3),
                   recovered_share=round(won / lost, 3) if lost > 0 else None)
    print(f"\nheld-out mu, K=3 every cycle, greedy, {args.eval_per_domain} prompts a domain, "
          f"{args.max_new_tokens} tokens (fine-tuned on {new}):")
    print(f"  {'drafter':<28}" + "".join(f"{d:>10}" for d in (*DOMAINS, "all")))
    print(f"  {'shipped layer, base target':<28}" + "".join(f"{before[d]:>10.3f}" for d in (*DOMAINS, "all")))
    for name, label in (("shipped", "(a) shipped, fine-tuned target"), ("mtp_tuned", "(b) MTP fine-tuned here"),
                        ("eagle3", "(c) EAGLE-3 from scratch"), ("ngram", "(d) n-gram")):
        print(f"  {label:<28}" + "".join(f"{after[name][d]:>10.3f}" for d in (*DOMAINS, "all")))
    share = f" = {won / lost:.0%} of it" if lost > 0 else ""
    print(f"on {new}: the fine-tune of the target took {lost:.3f} of mu from the shipped layer; the layer's own "
          f"fine-tune won back {won:.3f}{share}")
    print("seconds: " + ", ".join(f"{k} {v}" for k, v in figures["seconds"].items()))
    write_json(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
