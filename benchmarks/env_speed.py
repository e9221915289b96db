"""The speed of a PPO script's envs alone: made as the script makes them (its defaults and wrappers; the Atari envs are
also those of the distributed and the PQN Atari pairs), stepped with random actions, no agent. It is the ceiling of
that script's sps on this machine, and a run's sps over it is the share of the time the agent leaves to the envs: a
figure that travels between machines, where raw sps does not.

    python benchmarks/env_speed.py --repeats 3
    python benchmarks/env_speed.py --results runs/speedup/results.jsonl   # and each variant's sps against it
    python benchmarks/env_speed.py --frames   # on a GPU: what copying ppo_atari_envpool's frames there costs

Each repeat steps --iterations times after --warmup; the table gives the median env steps per second over repeats and
their range. With --results (run.sh's results.jsonl, from this machine), each variant's median sps is divided by the
envs' median (100%: an agent that costs nothing). With --frames, a second table: the Atari envs alone, then with each
step's frames copied to the GPU from pageable memory (`torch.as_tensor`) and through the twin's pinned buffer
(`make_frames_to_device`), each waited for as the training loop does; and each copy's cost in us a step.
"""

import argparse
import pathlib
import statistics

import gymnasium as gym
import torch
from common import Parser, env_steps_per_second, fail, load_script, read_results, variant  # benchmarks/ on the path

SCRIPTS = ("ppo_continuous_action", "ppo_atari_envpool")
# The pairs whose runs a script's envs are the ceiling of: the Atari pairs make the same envs (the same make_envs).
PAIRS = {"ppo_continuous_action": ("ppo_continuous_action",),
         "ppo_atari_envpool": ("ppo_atari_envpool", "ppo_atari_envpool_distributed", "pqn_atari_envpool")}  # fmt: skip


def make_envs(name):
    """The script's Args and its envs."""
    module = load_script(name)
    args = module.Args()
    if hasattr(module, "make_envs"):  # the Atari scripts
        return args, module.make_envs(args.env_id, args.num_envs, args.seed)
    make = [module.make_env(args.env_id, args.gamma) for _ in range(args.num_envs)]
    return args, gym.vector.SyncVectorEnv(make, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


if __name__ == "__main__":
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", nargs="+", choices=SCRIPTS, default=list(SCRIPTS))
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", type=pathlib.Path, help="run.sh's results.jsonl, from this machine")
    parser.add_argument("--frames", action="store_true", help="also time the Atari frames' copies to the GPU")
    args = parser.parse_args()
    if min(args.iterations, args.repeats) < 1 or args.warmup < 0:
        fail("--iterations and --repeats must be at least 1, --warmup at least 0")
    if args.frames and not torch.cuda.is_available():
        fail("--frames copies frames to a GPU: torch sees no CUDA device")
    results = read_results(args.results) if args.results else []
    timing = args.iterations, args.warmup  # each repeat's timed steps, after its warm-up

    print("| script | env | num_envs | env alone (steps/s) | variant | sps, median | sps / env alone |")
    print("|---|---|---|---|---|---|---|")
    for name in args.scripts:
        script_args, envs = make_envs(name)
        rates = [env_steps_per_second(envs, script_args.num_envs, *timing) for _ in range(args.repeats)]
        envs.close()
        env_rate = statistics.median(rates)
        spread = f"[{min(rates):.0f}, {max(rates):.0f}]"
        row = f"| {name} | {script_args.env_id} | {script_args.num_envs} | {env_rate:.0f} {spread}"
        by_variant = {}
        for result in results:
            pair = result["script"].removesuffix(".py").removesuffix("_torchcompile")
            if pair in PAIRS[name]:
                label = variant(result) if pair == name else f"{pair}: {variant(result)}"
                by_variant.setdefault(label, []).append(result["sps"])
        if not by_variant:
            print(f"{row} | | | |")
        for label, values in by_variant.items():
            sps = statistics.median(values)
            print(f"{row} | {label} | {sps:.0f} | {sps / env_rate:.0%} |")

    if args.frames:
        cuda = torch.device("cuda")
        script_args, envs = make_envs("ppo_atari_envpool")
        frames_shape = (script_args.num_envs, *envs.observation_space.shape)
        frames_to_device = load_script("ppo_atari_envpool_torchcompile").make_frames_to_device(frames_shape, cuda)
        copies = {
            "envs alone": None,
            "+ frames to the GPU, pageable (torch.as_tensor)": lambda obs: torch.as_tensor(obs, device=cuda),
            "+ frames to the GPU, pinned (the twin's frames_to_device)": frames_to_device,
        }

        def waited_for(copy):  # the policy needs the frames: a step waits for them (envs alone: no copy)
            return copy and (lambda obs: (copy(obs), torch.cuda.current_stream().synchronize()))

        rates = {label: [] for label in copies}
        for _ in range(args.repeats):
            for label, copy in copies.items():
                rates[label].append(env_steps_per_second(envs, script_args.num_envs, *timing, waited_for(copy)))
        envs.close()
        alone = statistics.median(rates["envs alone"])
        print(f"\n| {script_args.env_id}, {script_args.num_envs} envs | env steps/s, median [min, max] | us per step |")
        print("|---|---|---|")
        for label, values in rates.items():
            rate = statistics.median(values)
            cost = (1 / rate - 1 / alone) * script_args.num_envs * 1e6  # a step steps every env once
            print(f"| {label} | {rate:.0f} [{min(values):.0f}, {max(values):.0f}] | {cost:.0f} |")
