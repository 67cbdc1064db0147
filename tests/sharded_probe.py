"""Run under torchrun (tests/test_sharded_capture.py): load a tiny target split as `target.parallel` says, and write
what this process holds (parameter bytes, at rest and after forwards) and how its lock-step forwards compare with
the whole model's, one JSON file per rank. Every rank makes a different number of forwards of different shapes, so
the lock-step protocol (gathers, padding forwards, drain) is what keeps them in step."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def main(target_dir: str, parallel: str, tp_size: int, fsdp_size: int, out_dir: str) -> None:
    from draftsmith.data.capture import forward_hidden_states, target_argmax
    from draftsmith.serve.core.launch_target import load_launch_target
    from draftsmith.serve.core.layers import FINAL
    from draftsmith.serve.core.memory_plan import Workload
    from draftsmith.serve.core.process_group import finish, start
    from draftsmith.serve.core.sharded_target import local_parameter_bytes
    from draftsmith.serve.core.target import load_target
    from draftsmith.serve.core.target_config import TargetConfig

    torch.set_num_threads(1)
    here = start(device_type="cpu", command="(probe)")
    config = TargetConfig(spec=target_dir, parallel=parallel, tp_size=tp_size, fsdp_size=fsdp_size, device="cpu")
    work = Workload(task="capture", dtype="float32", tokens=64, stored_layers=3)
    target = load_launch_target(config, dtype="float32", device="cpu", workload=lambda hf: work, top1=True,
                                log=lambda msg: None)
    held = local_parameter_bytes(target.model)
    whole = load_target(target_dir)
    full = local_parameter_bytes(whole.model)
    layers = (0, 2, FINAL)
    generator = torch.Generator().manual_seed(here.rank)
    max_diff, top1_equal, forwards = 0.0, True, here.rank + 1
    for k in range(forwards):
        sequences = [torch.randint(0, 256, (int(n),), generator=generator).tolist()
                     for n in torch.randint(3, 12, (k % 3 + 1,), generator=generator)]
        from draftsmith.data.capture import forward_sharded

        mine = forward_sharded(target, sequences, layers)
        expected = forward_hidden_states(whole, sequences, layers)
        for (states, top1), reference in zip(mine, expected):
            max_diff = max(max_diff, *((states[i] - reference[i]).abs().max().item() for i in layers))
            top1_equal &= torch.equal(top1, target_argmax(whole.model.get_output_embeddings(), reference[FINAL]))
    target.sharded.drain()
    report = {"rank": here.rank, "world": here.world, "layout": target.sharded.layout.describe(), "held": held,
              "held_after": local_parameter_bytes(target.model), "full": full, "max_diff": max_diff,
              "top1_equal": bool(top1_equal), "forwards": forwards}
    Path(out_dir, f"rank{here.rank}.json").write_text(json.dumps(report))
    finish()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
