"""Env steps per second of gymnasium's synchronous and asynchronous vector envs, random actions, no agent: which
one SAC and TD3 should step their --num-envs envs with.

    python benchmarks/vector_env_speed.py --env-id HalfCheetah-v5 --num-envs 1 4 16 --repeats 3

Each repeat times both kinds one after the other (their order alternating), each for --iterations iterations after
--warmup, in this process (the asynchronous kind's envs each in a worker process, as it makes them); the table gives
the median over repeats of the env steps per second (iterations x envs / seconds), its range, and async / sync.
Both reset an ended episode in the step that ends it, as the scripts' envs do.
"""

import argparse
import statistics

import gymnasium as gym
from common import env_steps_per_second  # benchmarks/ is on the path when this file runs

KINDS = {"sync": gym.vector.SyncVectorEnv, "async": gym.vector.AsyncVectorEnv}


def steps_per_second(kind, env_id, num_envs, iterations, warmup):
    envs = KINDS[kind]([lambda: gym.make(env_id)] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    rate = env_steps_per_second(envs, num_envs, iterations, warmup)
    envs.close()
    return rate


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| env | num_envs | sync (steps/s) | async (steps/s) | async / sync |\n|---|---|---|---|---|")
    for num_envs in args.num_envs:
        rates = {kind: [] for kind in KINDS}
        for repeat in range(args.repeats):
            for kind in list(KINDS)[:: 1 if repeat % 2 == 0 else -1]:
                rates[kind].append(steps_per_second(kind, args.env_id, num_envs, args.iterations, args.warmup))
        medians = {kind: statistics.median(values) for kind, values in rates.items()}
        cells = [f"{medians[kind]:.0f} [{min(rates[kind]):.0f}, {max(rates[kind]):.0f}]" for kind in KINDS]
        print(f"| {args.env_id} | {num_envs} | {' | '.join(cells)} | {medians['async'] / medians['sync']:.2f}x |")
