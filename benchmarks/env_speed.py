"""The speed of a PPO script's envs alone: made as the script makes them, stepped with random actions, no agent.
It is the ceiling of that script's sps on this machine, and a run's sps over it is the share of the time the agent
leaves to the envs: a figure that travels between machines, where raw sps does not.

    python benchmarks/env_speed.py --repeats 3
    python benchmarks/env_speed.py --results runs/speedup/results.jsonl   # and each variant's sps against it

ppo_continuous_action: its default --num-envs of its default env, with its wrappers (observation and reward
normalisation, clipping, episode statistics), in a SyncVectorEnv with same-step autoreset, as its __main__ makes
them. ppo_atari_envpool: its make_envs, with its defaults (envpool, a thread per env). Each repeat steps --iterations
times after --warmup, the actions drawn before the clock starts; the table gives the median env steps per second
over repeats and their range. With --results (run.sh's results.jsonl, made on the same machine), each variant's
median sps is divided by the env's median: 100% would be an agent that costs nothing.
"""

import argparse
import importlib.util
import pathlib
import statistics
import sys
import time

import gymnasium as gym
import numpy as np
from speedup_table import read_results, variant  # benchmarks/ is on the path when this file runs

LEANRL = pathlib.Path(__file__).resolve().parent.parent / "leanrl"
sys.path.insert(0, str(LEANRL))  # the scripts import run_utils from their folder
SCRIPTS = ("ppo_continuous_action", "ppo_atari_envpool")


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, LEANRL / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the script's functions; its run is under __main__
    return module


def make_envs(name):
    module = load_script(name)
    args = module.Args()
    if name == "ppo_atari_envpool":
        return args, module.make_envs(args.env_id, args.num_envs, args.seed)
    envs = gym.vector.SyncVectorEnv(
        [module.make_env(args.env_id, args.gamma) for _ in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    return args, envs


def steps_per_second(envs, num_envs, iterations, warmup):
    envs.reset()
    envs.action_space.seed(0)
    if isinstance(envs, gym.vector.SyncVectorEnv):  # its action space is the batch's
        actions = [envs.action_space.sample() for _ in range(iterations + warmup)]
    else:  # envpool: the space of one env's action
        actions = [np.array([envs.action_space.sample() for _ in range(num_envs)]) for _ in range(iterations + warmup)]
    for action in actions[:warmup]:
        envs.step(action)
    start = time.perf_counter()
    for action in actions[warmup:]:
        envs.step(action)
    return iterations * num_envs / (time.perf_counter() - start)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", nargs="+", choices=SCRIPTS, default=list(SCRIPTS))
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", type=pathlib.Path, help="run.sh's results.jsonl, from this machine")
    args = parser.parse_args()
    results = read_results(args.results) if args.results else []

    print("| script | env | num_envs | env alone (steps/s) | variant | sps, median | sps / env alone |")
    print("|---|---|---|---|---|---|---|")
    for name in args.scripts:
        script_args, envs = make_envs(name)
        rates = [
            steps_per_second(envs, script_args.num_envs, args.iterations, args.warmup) for _ in range(args.repeats)
        ]
        envs.close()
        env_rate = statistics.median(rates)
        row = f"| {name} | {script_args.env_id} | {script_args.num_envs} | {env_rate:.0f} [{min(rates):.0f}, {max(rates):.0f}]"
        runs = [
            result for result in results if result["script"].removesuffix(".py").removesuffix("_torchcompile") == name
        ]
        by_variant = {}
        for result in runs:
            by_variant.setdefault(variant(result), []).append(result["sps"])
        if not by_variant:
            print(f"{row} | | | |")
        for label, values in by_variant.items():
            sps = statistics.median(values)
            print(f"{row} | {label} | {sps:.0f} | {sps / env_rate:.0%} |")
