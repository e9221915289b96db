"""pytest's hooks and fixtures for tests/. Test files import helpers.py and checks.py by name (pytest puts tests/ on
sys.path); helpers.py puts leanrl/ there too, where a script finds its sibling run_utils."""

import copy
import os
import signal

import gymnasium as gym
import pytest
import torch
from helpers import NEEDS_CUDA, CountingEnv, ImageObsEnv  # and leanrl/ on sys.path

# --- Several workers (pytest-xdist `-n auto`) ---------------------------------------------------------------------
#
# Each worker, and every run it starts, gets its share of the cores as threads (more threads than cores make OpenMP's
# threads wait for one another). pyproject.toml sets xdist's `worksteal` mode: each worker starts with an equal
# contiguous share of the collected order; the longest tests (matched by these name prefixes) are dealt out in turn at
# the front of the shares, so that no worker starts with most of them, nor is left with one at the end.
LONGEST_FIRST = ("test_learns", "test_twin_runs_with_every_flag_combination")


def pytest_configure(config):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the runs this worker starts inherit it
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    for item in items:  # every CUDA case is marked `cuda`: `pytest -m cuda` runs them alone on a GPU machine
        if any(mark.kwargs.get("reason") == NEEDS_CUDA for mark in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.cuda)

    def rank(item):
        return next((index for index, prefix in enumerate(LONGEST_FIRST) if item.name.startswith(prefix)), None)

    longest = sorted((item for item in items if rank(item) is not None), key=rank)  # stable: file order within a rank
    others = [item for item in items if rank(item) is None]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    # worksteal's shares at the start: worker i gets len(rest) // (workers - i) of the rest.
    sizes, left = [], len(items)
    for worker in range(workers):
        sizes.append(left // (workers - worker))
        left -= sizes[-1]
    # Dealt back and forth (0, 1, 1, 0, ...): the slower of a pair (a plain script and its twin) goes to either worker.
    shares = [[] for _ in range(workers)]
    for index, item in enumerate(longest):
        turn, seat = divmod(index, workers)
        shares[seat if turn % 2 == 0 else workers - 1 - seat].append(item)
    for share, size in zip(shares, sizes, strict=True):
        while len(share) < size and others:
            share.append(others.pop(0))
    items[:] = [item for share in shares for item in share] + others


@pytest.fixture(autouse=True)
def _fresh_compiler_state():
    """Each test compiles as a fresh process would (dynamo remembers the shapes a function was compiled for across
    runs, and would compile dynamic shapes), and its changes to torch.compile's global settings are undone."""
    import torch._dynamo.config
    import torch._inductor.config

    configs = (torch._dynamo.config, torch._inductor.config)
    saved = [config.get_config_copy() for config in configs]
    torch._dynamo.reset()
    yield
    for config, before in zip(configs, saved, strict=True):
        after = config.get_config_copy()
        for key, value in before.items():
            if after.get(key) is not value and after.get(key) != value:
                setattr(config, key, value)


@pytest.fixture(autouse=True)
def _float32_on_cuda():
    """Full float32 matmuls and convolutions on CUDA (not TF32, cuDNN's default): the equivalence tests need it."""
    if not torch.cuda.is_available():
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(autouse=True)
def _signal_handlers_kept():
    """No test leaves SIGINT or SIGTERM handled otherwise: the processes later tests start would inherit it."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    after = {signum: signal.getsignal(signum) for signum in before}
    assert after == before, f"the test changed the signal handlers: {before} -> {after}"


@pytest.fixture
def inductor_fallback_random(monkeypatch):
    """Random ops inside compiled code draw from the eager generator, so seeded samples match eager ones; also where
    a script passes fallback_random in torch.compile's options (TD3's twin on CUDA), which override the setting."""
    import torch._inductor.config as inductor_config

    compile_ = torch.compile

    def compile_with_fallback_random(*args, options=None, **kwargs):
        if options and "fallback_random" in options:
            options = {**options, "fallback_random": True}
        return compile_(*args, options=options, **kwargs)

    monkeypatch.setattr(torch, "compile", compile_with_fallback_random)
    with inductor_config.patch(fallback_random=True):
        yield


@pytest.fixture
def saved_checkpoints(monkeypatch):
    """A copy of every checkpoint a run in this process passes to torch.save (not other objects: torch.distributed's
    all_gather_object serialises through torch.save too)."""
    saved = []
    real_save = torch.save

    def save(obj, *args, **kwargs):
        if isinstance(obj, dict) and "global_step" in obj:
            saved.append(copy.deepcopy(obj))
        return real_save(obj, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    return saved


@pytest.fixture
def registered_counting_and_image_envs():
    """helpers.CountingEnv and ImageObsEnv registered in gymnasium, for runs in this process."""
    gym.register("LeanrlTestCounting-v0", entry_point=CountingEnv, max_episode_steps=5)
    gym.register("LeanrlTestImageObs-v0", entry_point=ImageObsEnv)
    yield
    del gym.registry["LeanrlTestCounting-v0"], gym.registry["LeanrlTestImageObs-v0"]
