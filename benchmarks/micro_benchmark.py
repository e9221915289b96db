"""Micro-benchmark: action selection and one update of each algorithm, eager against compile configurations.

The agents are the scripts' own (their `build_*` functions), timed in isolation on random inputs: action selection at
batch 1, 4, 16 and 256 (PPO Atari: 8, its envs' count), and one update at the training batch size. Each configuration
loads a fresh copy of the script. All configurations are compiled first, then timed in turn within each repeat (a slow
spell of a shared machine hits them alike); times are medians over the repeats of many calls each, and the speed-up is
against the plain script in eager mode. "twin --compile, cpp_wrapper" calls the compiled code from generated C++ (the
continuous PPO twin's choice on a CPU). The --bf16 configurations (SAC, TD3, PPO Atari: the twins with the switch) run
only where the device computes bf16 faster than fp32 (run_utils.fast_bf16); elsewhere a line says they are skipped.

A second table puts each update next to its matmul floor, measured in the same run: the matrix products (and PPO
Atari's convolutions) that the twin's update makes, recorded with their shapes, strides and dtypes, replayed alone on
random tensors; the --bf16 update next to the floor of the eager --bf16 twin's products (bf16 where autocast runs them
in bf16). Their FLOPs divided by that time is this machine's fp32 rate at those shapes; the floor is what the update
would take if it did nothing but these products.

    python benchmarks/micro_benchmark.py                         # every algorithm, on CPU (and CUDA if present)
    python benchmarks/micro_benchmark.py --algos sac td3 --configs "plain (eager)" "twin --compile" \
        "twin --compile --bf16" --repeats 9                       # bf16 against fp32, each against its floor
    python benchmarks/micro_benchmark.py --algos dqn --configs "plain (eager)" "twin (eager)" --repeats 1 --calls 2
                                                                 # a smoke run: seconds, its times meaningless
"""

import argparse
import itertools
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch._dynamo.config
import torch._inductor.config
from common import Parser, cpu_name, fail, load_script, table_head, table_row  # benchmarks/ is on the path
from run_utils import fast_bf16  # from leanrl/, which common puts on the path
from tensordict import TensorDict
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

OBS_DIM, ACTION_DIM = 17, 6  # HalfCheetah-v5
CARTPOLE_OBS_DIM, CARTPOLE_ACTIONS = 4, 2  # DQN's default env, CartPole-v1
ATARI_FRAMES, ATARI_ACTIONS = (4, 84, 84), 4  # PPO Atari's stacked frames; Breakout-v5's actions
ACTION_BATCHES = (1, 4, 16, 256)
BOUNDS = -np.ones(ACTION_DIM, dtype=np.float32), np.ones(ACTION_DIM, dtype=np.float32)  # HalfCheetah's actions


def replay_batch(batch_size, device):
    return TensorDict(
        observations=torch.randn(batch_size, OBS_DIM),
        next_observations=torch.randn(batch_size, OBS_DIM),
        actions=torch.rand(batch_size, ACTION_DIM) * 2 - 1,
        rewards=torch.randn(batch_size),
        terminations=(torch.rand(batch_size) < 0.1).float(),
        batch_size=[batch_size],
    ).to(device)


def ppo_minibatch(batch_size, device):
    return TensorDict(
        obs=torch.randn(batch_size, OBS_DIM),
        actions=torch.randn(batch_size, ACTION_DIM),
        logprobs=torch.randn(batch_size) - 8,
        advantages=torch.randn(batch_size),
        returns=torch.randn(batch_size),
        values=torch.randn(batch_size),
        batch_size=[batch_size],
    ).to(device)


def atari_minibatch(batch_size, device):
    """Frames as each loop hands them to its update: uint8 in channels-last order (the twin), float32 (the plain)."""
    obs = torch.randint(0, 256, (batch_size, *ATARI_FRAMES), dtype=torch.uint8)
    return TensorDict(
        obs=obs.contiguous(memory_format=torch.channels_last),
        float_obs=obs.float(),
        actions=torch.randint(ATARI_ACTIONS, (batch_size,)),
        logprobs=torch.randn(batch_size) - 1.4,
        advantages=torch.randn(batch_size),
        returns=torch.randn(batch_size),
        values=torch.randn(batch_size),
        mask=(torch.rand(batch_size) > 0.02).float(),
        batch_size=[batch_size],
    ).to(device)


def dqn_batch(batch_size, device):
    return TensorDict(
        observations=torch.randn(batch_size, CARTPOLE_OBS_DIM),
        next_observations=torch.randn(batch_size, CARTPOLE_OBS_DIM),
        actions=torch.randint(CARTPOLE_ACTIONS, (batch_size,)),
        rewards=torch.ones(batch_size),
        terminations=(torch.rand(batch_size) < 0.05).float(),
        batch_size=[batch_size],
    ).to(device)


def off_policy_update(agent, batch, which):
    """One training step's work: a critic update, an actor update and a target update."""
    agent.update_critic(batch)
    agent.update_actor(batch)
    agent.update_targets()


def ppo_update(agent, minibatch, which):
    """One minibatch update; the twin takes the TensorDict, the plain script the tensors one by one."""
    if which == "twin":
        agent.update(minibatch)
    else:
        agent.update(*(minibatch[key] for key in ("obs", "actions", "logprobs", "advantages", "returns", "values")))


def ppo_atari_update(agent, minibatch, which):
    if which == "twin":
        agent.update(minibatch.exclude("float_obs"))
    else:
        keys = ("actions", "logprobs", "advantages", "returns", "values", "mask")
        agent.update(minibatch["float_obs"], *(minibatch[key] for key in keys))


def dqn_update(agent, batch, which):
    """One gradient step (a run makes one every train_frequency env steps; its target copy, every 500 steps, is left
    out); the plain script's replay buffer gives a dict of tensors."""
    agent.update(batch if which == "twin" else dict(batch.items()))


def policy_act(agent, obs, which):
    return agent.policy(obs)


def atari_act(agent, frames, which):
    """The plain script's loop turns the envs' uint8 frames into float32 before its policy; the twin's does not."""
    return agent.policy(frames.float() if which == "plain" else frames)


def dqn_act(agent, obs, which):
    """What a run calls to act at its final epsilon (0.05: 95% of the steps; the rest are random actions drawn on the
    host): the greedy actions; on CUDA the twin's whole epsilon-greedy selection, which runs on the device."""
    if which == "twin" and obs.device.type == "cuda":
        return agent.policy(obs, agent.micro_benchmark_epsilon)
    return agent.greedy_actions(obs)


def builder(name, *dims):
    """The agent of the script's build_<name>(*dims, args, device)."""
    return lambda module, args, device: getattr(module, f"build_{name}")(*dims, args, device)


def build_dqn(module, args, device):
    agent = module.build_dqn(CARTPOLE_OBS_DIM, CARTPOLE_ACTIONS, args, device)
    agent.micro_benchmark_epsilon = torch.tensor(0.05, device=device)  # the twin's policy reads it from the device
    return agent


def vectors(size):
    return lambda batch, device: torch.randn(batch, size, device=device)


def frames(batch, device):
    return torch.randint(0, 256, (batch, *ATARI_FRAMES), dtype=torch.uint8, device=device)


# algorithm -> plain script (the twin adds _torchcompile), builder, one training step's update, its batch size, the
# maker of such a batch, the call that selects actions, the maker of its observations and the batches it is timed at.
ALGOS = {
    "sac": ("sac_continuous_action", builder("sac", OBS_DIM, ACTION_DIM, *BOUNDS), off_policy_update, 256, replay_batch,
            policy_act, vectors(OBS_DIM), ACTION_BATCHES),
    "td3": ("td3_continuous_action", builder("td3", OBS_DIM, ACTION_DIM, *BOUNDS), off_policy_update, 256, replay_batch,
            policy_act, vectors(OBS_DIM), ACTION_BATCHES),
    "ppo_continuous": ("ppo_continuous_action", builder("ppo", OBS_DIM, ACTION_DIM), ppo_update, 64, ppo_minibatch,
                       policy_act, vectors(OBS_DIM), ACTION_BATCHES),
    "dqn": ("dqn", build_dqn, dqn_update, 128, dqn_batch, dqn_act, vectors(CARTPOLE_OBS_DIM), ACTION_BATCHES),
    "ppo_atari": ("ppo_atari_envpool", builder("ppo", ATARI_ACTIONS), ppo_atari_update, 256, atari_minibatch, atari_act,
                  frames, (8,)),
}  # fmt: skip

# configuration -> (which script, the twin's flags, inductor options patched while compiling, device types).
CONFIGS = {
    "plain (eager)": ("plain", {}, {}, ("cpu", "cuda")),
    "twin (eager)": ("twin", {}, {}, ("cpu", "cuda")),
    "twin --compile": ("twin", {"compile": True}, {}, ("cpu", "cuda")),
    "twin --compile, cpp_wrapper": ("twin", {"compile": True}, {"cpp_wrapper": True}, ("cpu", "cuda")),
    # Hidden layers in bf16 (the twins with --bf16), where the device computes bf16 faster than fp32.
    "twin --compile --bf16": ("twin", {"compile": True, "bf16": True}, {}, ("cpu", "cuda")),
    "twin --compile --cudagraphs": ("twin", {"compile": True, "cudagraphs": True}, {}, ("cuda",)),
}


# calls per timed run, by measure
CALLS_PER_TIMING = {"act": 200, "update": 50, "matmul floor": 50}


def time_per_call(fn, calls):
    """Seconds per call over one timed run of `calls` calls (after the caller's warm-up)."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls


def prepare(algo, config, device):
    """{(measure, batch): a call to time} for one algorithm, configuration and device, compiled and warmed up."""
    plain_name, build, update, train_batch, make_batch, act, observations, act_batches = ALGOS[algo]
    which, flags, inductor_options, _ = CONFIGS[config]
    script = plain_name if which == "plain" else f"{plain_name}_torchcompile"

    def new_agent():
        """The agent of a fresh copy of the script: compiled code of its own (dynamo keeps it per code object)."""
        torch.manual_seed(0)
        module = load_script(script)
        return build(module, module.Args(**flags), device)

    agent = new_agent()
    calls = {}
    # Compilation happens at the first calls, so the inductor options stay patched through the warm-up.
    with torch._inductor.config.patch(inductor_options):
        for batch in act_batches:
            obs = observations(batch, device)
            # Compiled, each batch size gets an agent (and a graph) of its own, as a run has one: a CUDA graph replays
            # one input shape, and dynamo's lookup among several compiled shapes is not a run's cost.
            actor = new_agent() if flags.get("compile") else agent
            calls[("act", batch)] = lambda obs=obs, actor=actor: act(actor, obs, which)
        data = make_batch(train_batch, device)
        calls[("update", train_batch)] = lambda: update(agent, data, which)
        for call in calls.values():
            for _ in range(10):  # compile and warm up (CUDA graphs are recorded after a few calls)
                call()
    return calls


# The ops the floor replays: matrix products, and the convolutions of PPO Atari's network.
FLOOR_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
             torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default}  # fmt: skip


class MatmulRecorder(TorchDispatchMode):
    """Notes every matrix product (or convolution) made under it: the op, and the shape, strides and dtype of each
    tensor argument."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in FLOOR_OPS:
            layouts = [(a.shape, a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args]
            self.calls.append((func, layouts, kwargs or {}))
        return func(*args, **(kwargs or {}))


def prepare_matmul_floor(algo, device, bf16=False):
    """(the FLOPs of one update of the eager twin (with bf16, the --bf16 twin's), a call that replays alone its matrix
    products on random tensors of their shapes, strides and dtypes)."""
    plain_name, build, update, train_batch, make_batch, *_ = ALGOS[algo]
    module = load_script(f"{plain_name}_torchcompile")
    torch.manual_seed(0)
    agent = build(module, module.Args(bf16=True) if bf16 else module.Args(), device)
    data = make_batch(train_batch, device)
    for _ in range(3):
        update(agent, data, "twin")
    with FlopCounterMode(display=False) as flop_counter, MatmulRecorder() as recorder:
        update(agent, data, "twin")

    def random_tensor(shape, stride, dtype):
        storage_size = 1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))
        return torch.randn(storage_size, device=device, dtype=dtype).as_strided(shape, stride)

    replay = [
        (func, [random_tensor(*a) if isinstance(a, tuple) else a for a in layouts], kw)
        for func, layouts, kw in recorder.calls
    ]

    def run_matmuls():
        for func, args, kwargs in replay:
            func(*args, **kwargs)

    for _ in range(10):
        run_matmuls()
    return flop_counter.get_total_flops(), {("matmul floor", train_batch): run_matmuls}


def measure(algo, configs, device, repeats):
    """{configuration: {(measure, batch): median seconds per call}}, and the update's FLOPs; "matmul floor" holds the
    floor of the update, "matmul floor (bf16)" that of the --bf16 twin when a --bf16 configuration is among them.
    Every configuration is compiled first; then each repeat times every call of every configuration in turn, the
    floors among them, so that a slow spell of a shared machine hits all of them alike."""
    calls = {}
    for config in configs:
        print(f"{algo} on {device.type}: compiling and warming up {config}", flush=True)
        calls[config] = prepare(algo, config, device)
    flops, calls["matmul floor"] = prepare_matmul_floor(algo, device)
    if any(CONFIGS[config][1].get("bf16") for config in configs):
        calls["matmul floor (bf16)"] = prepare_matmul_floor(algo, device, bf16=True)[1]
    times = {config: {key: [] for key in config_calls} for config, config_calls in calls.items()}
    for repeat in range(repeats):
        print(f"{algo} on {device.type}: timing, repeat {repeat + 1} of {repeats}", flush=True)
        for config, config_calls in calls.items():
            for key, call in config_calls.items():
                times[config][key].append(time_per_call(call, CALLS_PER_TIMING[key[0]]))
    medians = {config: {key: statistics.median(t) for key, t in by_key.items()} for config, by_key in times.items()}
    return medians, flops


def main():
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu, and cuda when present")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown table to this file")
    parser.add_argument("--calls", type=int, help="calls per timed run (default: 200 to act, 50 to update and floor)")
    args = parser.parse_args()
    for flag, count in (("--repeats", args.repeats), ("--calls", args.calls)):
        if count is not None and count <= 0:
            fail(f"{flag} must be positive")
    if args.calls:
        CALLS_PER_TIMING.update(dict.fromkeys(CALLS_PER_TIMING, args.calls))
    devices = args.devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if "cuda" in devices and not torch.cuda.is_available():
        fail("--devices cuda: no CUDA device here")
    # Each batch size of action selection gets its own static graph, as in a real run (one batch size each).
    torch._dynamo.config.automatic_dynamic_shapes = False
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * len(ACTION_BATCHES))

    machine = f"CPU: {cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    if "cuda" in devices:
        machine += f"; GPU: {torch.cuda.get_device_name()}"
    header = ("algorithm", "device", "measure", "batch", "configuration", "us per call", "calls/s", "speed-up")
    lines = [f"{machine}; torch {torch.__version__}; median of {args.repeats} repeats", "", *table_head(*header)]
    floors = {}  # (algo, device type) -> (the update's FLOPs, what measure() measured)
    for algo, device_type in itertools.product(args.algos, devices):
        device = torch.device(device_type)
        configs = [config for config in args.configs if device_type in CONFIGS[config][3]]
        twin_has_bf16 = hasattr(load_script(f"{ALGOS[algo][0]}_torchcompile").Args, "bf16")
        if not twin_has_bf16 or not fast_bf16(device):
            skipped = [config for config in configs if CONFIGS[config][1].get("bf16")]
            configs = [config for config in configs if config not in skipped]
            if skipped:
                why = "has no --bf16" if not twin_has_bf16 else f"{device} does not compute bf16 faster than fp32"
                print(f"{algo} on {device_type}: skipping {', '.join(skipped)}: its twin {why}", flush=True)
        measured, flops = measure(algo, configs, device, args.repeats)
        floors[(algo, device_type)] = flops, measured
        baseline = measured.get("plain (eager)")
        for key in measured[configs[0]]:
            for config in configs:
                seconds = measured[config][key]
                speedup = f"{baseline[key] / seconds:.2f}x" if baseline else "n/a"
                cells = config, f"{seconds * 1e6:.0f}", f"{1 / seconds:.0f}", speedup
                lines.append(table_row(algo, device_type, *map(str, key), *cells))
    if "plain (eager)" in args.configs and "twin --compile" in args.configs:
        lines += [
            "",
            "| algorithm | device | update batch | GFLOP per update | matmul floor (us) | GFLOP/s at these shapes |"
            " plain (eager), us (x floor) | twin --compile, us (x floor) | bf16 matmul floor (us) |"
            " twin --compile --bf16, us (x bf16 floor) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for (algo, device_type), (flops, measured) in floors.items():
            update, floor_key = ("update", ALGOS[algo][3]), ("matmul floor", ALGOS[algo][3])
            plain, twin = measured["plain (eager)"][update], measured["twin --compile"][update]
            floor, bf16_cells = measured["matmul floor"][floor_key], "– | –"
            if "twin --compile --bf16" in measured:
                bf16, bf16_floor = measured["twin --compile --bf16"][update], measured["matmul floor (bf16)"][floor_key]
                bf16_cells = f"{bf16_floor * 1e6:.0f} | {bf16 * 1e6:.0f} ({bf16 / bf16_floor:.2f}x)"
            cells = [f"{flops / 1e9:.3f}", f"{floor * 1e6:.0f}", f"{flops / floor / 1e9:.0f}"]
            cells += [f"{update * 1e6:.0f} ({update / floor:.2f}x)" for update in (plain, twin)]
            lines.append(table_row(algo, device_type, str(ALGOS[algo][3]), *cells, bf16_cells))
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
