"""What the tools of benchmarks/ share: the one-line error exit, the machine a figure was made on, a script of leanrl/
imported as a module, the results lines the scripts write (--results-path), markdown tables. Neither torch nor
matplotlib is imported at module level: the tools that only read results, and rpc_agent_observer.py's workers, start
fast. Importing it puts leanrl/ on the path, where the scripts (and the tools) import run_utils from."""

import argparse
import importlib.util
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEANRL = ROOT / "leanrl"
sys.path.insert(0, str(LEANRL))
# The devices where run_utils.fast_bf16 holds, in words, for the tools' lines on --bf16.
FAST_BF16 = "a CUDA GPU of compute capability 8+, AMX or an AMD CPU's AVX512-BF16"
# The fields of a results line that the tables read.
FIELDS = (
    "script algo env_id seed compile cudagraphs device torch_version total_timesteps sps compile_seconds final_return"
).split()


def fail(message, status=2):
    """A user's mistake: one line on stderr, named for the tool run, and exit status 2."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    sys.exit(status)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # a bad option: one line, as fail() gives, not argparse's usage and message
        fail(message)


def table_row(*cells):
    return "| " + " | ".join(cells) + " |"


def table_head(*names):
    """A markdown table's header row and the rule under it."""
    return [table_row(*names), "|---" * len(names) + "|"]


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_machine():
    import torch  # only here: reading and tabulating results needs no torch
    from run_utils import fast_bf16

    return {
        "cpu": cpu_name(),
        # the vector instructions torch's CPU kernels use: machines that differ in it round differently
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        # whether the device the scripts pick computes bf16 faster than fp32: run.sh then runs the twins' --bf16 too
        "fast_bf16": fast_bf16(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
    }


def machine_text(machine):
    gpu = f"GPU {machine['gpu']}" if machine["gpu"] else "no CUDA GPU"
    threads = machine["torch_threads"]
    cpu = f"{machine['cpu']} ({machine['cpu_capability']})" if "cpu_capability" in machine else machine["cpu"]
    return f"{cpu}, {machine['cores']} cores ({threads} torch thread{'s' if threads != 1 else ''}), {gpu}"


_loaded = itertools.count()


def load_script(name):
    """A fresh module of leanrl/<name>.py, its definitions run (its run is under __main__): each call executes the
    file again, so its code objects, and torch.compile's caches keyed on them, are its own."""
    module_name = f"leanrl_{name}_{next(_loaded)}"
    spec = importlib.util.spec_from_file_location(module_name, LEANRL / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses, pickling and torch.compile look modules up here
    spec.loader.exec_module(module)
    return module


def env_steps_per_second(envs, num_envs, iterations, warmup, after_step=None):
    """Env steps per second of vector envs (a step steps each of num_envs) over `iterations` steps after `warmup`,
    random actions drawn before the clock starts; after_step(observations), if any, in each step."""
    import gymnasium as gym  # only here, as numpy: the tools that read results need neither
    import numpy as np

    envs.reset()
    envs.action_space.seed(0)
    batched = isinstance(envs, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv))  # envpool's: one env's actions
    one = envs.action_space.sample
    actions = [one() if batched else np.array([one() for _ in range(num_envs)]) for _ in range(iterations + warmup)]
    for step, action in enumerate(actions):
        if step == warmup:  # the warm-up steps make the first copies too (CUDA's start, pinned memory's allocation)
            start = time.perf_counter()
        observations = envs.step(action)[0]
        if after_step:
            after_step(observations)
    return iterations * num_envs / (time.perf_counter() - start)


def read_results(path):
    """The runs of a results file, one JSON object a line, each with FIELDS; a user's error names the line."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            fail(f"{path}, line {number}: not a JSON object")
        if missing := [field for field in FIELDS if field not in row]:
            fail(f"{path}, line {number}: no {', '.join(missing)} (not a --results-path line?)")
        rows.append(row)
    if not rows:
        fail(f"{path} holds no results")
    return rows


def variant(row):
    """The variant of a run: plain script, or twin plus the flags that were in effect (the recorded ones)."""
    if not row["script"].endswith("_torchcompile.py"):
        return "plain"
    return "+".join(["twin"] + [flag for flag in ("compile", "cudagraphs", "bf16") if row.get(flag)])
