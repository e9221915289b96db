"""Building a twin changes no process-wide setting but, with --compile, those twin_utils.set_compile_settings states:
dynamo's trace_autograd_ops and a filter for tensordict's lock warning (none for PQN Atari's twin on a CPU)."""

import warnings

import numpy as np
import pytest
import torch
import torch._dynamo.config
import torch._inductor.config
import torch.distributed as dist
from helpers import load_script

LOW, HIGH = -np.ones(6, dtype=np.float32), np.ones(6, dtype=np.float32)
# twin -> its build from Args on a device (HalfCheetah's sizes, CartPole's, Breakout's actions)
BUILDS = {
    "sac_continuous_action_torchcompile": lambda m, args, device: m.build_sac(17, 6, LOW, HIGH, args, device),
    "td3_continuous_action_torchcompile": lambda m, args, device: m.build_td3(17, 6, LOW, HIGH, args, device),
    "ppo_continuous_action_torchcompile": lambda m, args, device: m.build_ppo(17, 6, args, device),
    "dqn_torchcompile": lambda m, args, device: m.build_dqn(4, 2, args, device),
    "pqn_torchcompile": lambda m, args, device: m.build_pqn(4, 2, args, device),
    "ppo_atari_envpool_torchcompile": lambda m, args, device: m.build_ppo(4, args, device),
    "ppo_atari_envpool_distributed_torchcompile": lambda m, args, device: m.build_ppo(4, args, device),
    "pqn_atari_envpool_torchcompile": lambda m, args, device: m.build_pqn(4, args, device),
}
LOCK_WARNING = r"Using lock_\(\) inside a compiled graph"


def process_settings():
    """The settings a build could change for the whole process."""
    return {
        **{f"dynamo.{key}": value for key, value in torch._dynamo.config.get_config_copy().items()},
        **{f"inductor.{key}": value for key, value in torch._inductor.config.get_config_copy().items()},
        "warnings filters": list(warnings.filters),
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
        "threads": torch.get_num_threads(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn": (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark),
    }


def changes(before, after):
    """{setting: (before, after)} of the settings that differ; the warnings filters as the list of those added."""
    changed = {key: (before[key], after[key]) for key in before if repr(before[key]) != repr(after[key])}
    if "warnings filters" in changed:
        added = [entry for entry in after["warnings filters"] if entry not in before["warnings filters"]]
        changed["warnings filters"] = [(action, message.pattern if message else None) for action, message, *_ in added]
    return changed


@pytest.mark.parametrize("compile_", [False, True], ids=["eager", "compile"])
@pytest.mark.parametrize("twin", BUILDS)
def test_building_a_twin_changes_only_the_stated_settings(twin, compile_, monkeypatch):
    module = load_script(twin)
    monkeypatch.setattr(torch._dynamo.config, "trace_autograd_ops", False)  # as a fresh process has it
    monkeypatch.setattr(
        warnings, "filters", [f for f in warnings.filters if f[1] is None or f[1].pattern != LOCK_WARNING]
    )
    distributed = "distributed" in twin
    if distributed:  # a world of one, as a plain launch of the script makes it
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        before = process_settings()
        BUILDS[twin](module, module.Args(compile=compile_), torch.device("cpu"))
        changed = changes(before, process_settings())
    finally:
        if distributed:
            dist.destroy_process_group()
    stated = {"dynamo.trace_autograd_ops": (False, True), "warnings filters": [("ignore", LOCK_WARNING)]}
    compiles_with_backward = compile_ and twin != "pqn_atari_envpool_torchcompile"  # PQN Atari on a CPU: see above
    assert changed == (stated if compiles_with_backward else {}), changed
