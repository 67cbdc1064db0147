"""The busy-machine thread policy (serve/core/threads.py): --threads wins; else torch's default lowered to the cores
idle at start, never below 1, with one line saying so; every command that runs a target takes --threads."""
from __future__ import annotations

import pytest
import torch

import draftsmith.serve.core.threads as threads
from draftsmith.cli import build_parser, main
from draftsmith.serve.core.threads import ThreadChoice, apply_threads, choose_threads, idle_cores, usable_cores


def test_the_policy():
    assert choose_threads(3, default=2, idle=0.1) == 3  # --threads wins, even above the default
    assert choose_threads(None, default=2, idle=None) == 2  # nothing measured: torch's choice
    assert choose_threads(None, default=2, idle=1.9) == 2  # quiet
    assert choose_threads(None, default=2, idle=1.0) == 1  # one core busy elsewhere
    assert choose_threads(None, default=2, idle=1.6) == 1  # a core counts when at least 3/4 idle
    assert choose_threads(None, default=2, idle=0.0) == 1  # never below one
    assert choose_threads(None, default=8, idle=5.8) == 6 and choose_threads(None, default=4, idle=16) == 4
    assert ThreadChoice(threads=2, default=2, idle=1.9, requested=None).note() is None
    assert ThreadChoice(threads=1, default=2, idle=0.5, requested=1).note() is None  # the user chose
    note = ThreadChoice(threads=1, default=2, idle=0.9, requested=None).note()
    assert note.startswith("note: the machine is busy (0.9 of ") and "1 thread instead of 2 (--threads N" in note


def test_measured_idle_cores_are_within_the_usable_ones():
    idle = idle_cores(interval=0.05)
    assert idle is not None and 0 <= idle <= usable_cores() + 0.01


def test_apply_lowers_torch_to_the_idle_cores_and_says_so(monkeypatch):
    monkeypatch.setattr(threads, "_torch_default", 2)
    monkeypatch.setattr(threads, "idle_cores", lambda interval=0.2: 0.7)
    said = []
    choice = apply_threads(None, log=said.append)
    assert (choice.threads, torch.get_num_threads()) == (1, 1) and len(said) == 1 and "busy" in said[0]
    said.clear()
    assert apply_threads(2, log=said.append).threads == 2 and torch.get_num_threads() == 2 and said == []
    monkeypatch.setattr(threads, "idle_cores", lambda interval=0.2: 1.95)
    assert apply_threads(None, log=said.append).threads == 2 and said == []
    torch.set_num_threads(1)


@pytest.mark.parametrize("command", [["data", "build", "--target", "t", "--out", "o"],
                                     ["data", "capture", "--target", "t", "--dataset", "d", "--out", "o"],
                                     ["train"], ["eval"], ["generate"], ["serve"], ["demo"]])
def test_every_command_that_runs_a_target_takes_threads(command):
    assert build_parser().parse_args([*command, "--threads", "3"]).threads == 3


def test_threads_reaches_the_config(capsys):
    assert main(["train", "data.dataset=x", "--threads", "3", "--print-config"]) == 0
    assert "  threads: 3\n" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "x", "--threads", "0"])
    assert "target.threads must be at least 1, got 0" in capsys.readouterr().err


def test_this_process_own_busy_threads_do_not_count_as_a_busy_machine(monkeypatch):
    """OpenMP workers spinning after earlier work are this process's, not another's: the cores they use count as
    idle (else a quiet machine would look busy to a command that already ran torch). Idle is each core's share of
    the time it accounted for: this VM accounts for only half of the wall time."""
    import collections
    import sys
    import types

    Core = collections.namedtuple("Core", "user system idle iowait")
    snapshots = iter([[Core(0, 0, 0, 0), Core(0, 0, 0, 0)],     # before
                      [Core(0.1, 0, 0, 0), Core(0, 0, 0.1, 0)]])  # after 0.2 s: core 0 busy, core 1 idle
    own = iter([types.SimpleNamespace(user=0.0, system=0.0), types.SimpleNamespace(user=0.1, system=0.0)])

    class Process:
        def cpu_times(self):  # this process used core 0 all along
            return next(own)

    fake = types.SimpleNamespace(Process=Process, cpu_times=lambda percpu: next(snapshots))
    monkeypatch.setitem(sys.modules, "psutil", fake)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(threads.time, "sleep", lambda seconds: None)
    assert idle_cores(interval=0.2) == pytest.approx(2.0)
