"""Learning evidence for PPO on Atari: one run's return curve against a random policy, as a PNG and a JSON summary.

It runs a PPO Atari script in this process and records, beside it, every step envpool makes: each finished game's
unclipped score (all lives) and the env steps done when it ended. The recorded scores must equal the script's own
`episode_returns`, so the curve is the script's report, step-stamped. A uniformly random policy plays the same
game with the same env settings for the baseline.

    python benchmarks/atari_learning_curve.py --total-timesteps 500000 --out docs/breakout_ppo_500k.png

With --processes N it runs the script in a world of N processes (torchrun on this machine; a distributed script of
leanrl/): each rank records its own envs, a game's step is the global step count (every rank steps in lockstep), and
rank 0 puts the games of all ranks in the order the script reports them, checks them against its `episode_returns`
and writes the plot and summary.

    python benchmarks/atari_learning_curve.py --script ppo_atari_envpool_distributed_torchcompile --processes 2 \\
        --total-timesteps 500000 --out docs/breakout_distributed/world2.png

With --compare it runs nothing: it draws the curves of runs it summarised before (their JSON files) on one plot.

    python benchmarks/atari_learning_curve.py --compare docs/breakout_distributed/world1.json \\
        docs/breakout_distributed/world2.json --out docs/breakout_distributed/worlds.png
"""

import argparse
import json
import os
import runpy
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import envpool
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class GameRecorder:
    """Wraps an envpool env: per finished game (game over or time limit), its unclipped score and the step count."""

    def __init__(self, envs):
        self.envs = envs
        self.steps = 0
        self.scores = np.zeros(envs.config["num_envs"])
        self.games = []  # (env steps so far, score)

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.envs.step(action)
        self.steps += len(action)
        self.scores += info["reward"]
        for index in np.flatnonzero(info["terminated"].astype(bool) | truncated):
            self.games.append((self.steps, float(self.scores[index])))
            self.scores[index] = 0.0
        return obs, reward, terminated, truncated, info


def random_policy_scores(env_id, games, seed):
    """Scores of `games` full games of uniformly random actions, with the training runs' env settings."""
    envs = GameRecorder(
        envpool.make(env_id, env_type="gymnasium", num_envs=8, episodic_life=True, reward_clip=True, seed=seed)
    )
    envs.reset()
    rng = np.random.default_rng(seed)
    while len(envs.games) < games:
        envs.step(rng.integers(envs.action_space.n, size=8))
    return [score for _, score in envs.games[:games]]


def launch_world(nproc):
    """Runs this command again under torchrun with nproc ranks on this machine; returns torchrun's exit status."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               __file__, *sys.argv[1:]]  # fmt: skip
    return subprocess.run(command).returncode


def gather_ranks_games(games, out, rank, world_size, timeout=600):
    """Every rank's games on rank 0, from files beside --out (the script has closed its process group by now):
    [(rank, env steps of that rank, score)]. Ranks other than 0 write theirs and get None."""

    def rank_file(r):
        return out.with_name(f".{out.stem}.rank{r}.json")

    if rank != 0:
        temporary = out.with_name(f".{out.stem}.rank{rank}.tmp")
        temporary.write_text(json.dumps(games))
        temporary.replace(rank_file(rank))
        return None
    deadline = time.monotonic() + timeout
    gathered = [(0, steps, score) for steps, score in games]
    for other in range(1, world_size):
        other_path = rank_file(other)
        while not other_path.exists():
            if time.monotonic() > deadline:
                sys.exit(f"rank {other} wrote no games in {timeout} s")
            time.sleep(0.5)
        gathered += [(other, steps, score) for steps, score in json.loads(other_path.read_text())]
        other_path.unlink()
    return gathered


def compare(summaries, out, window=20):
    """The mean of the last `window` games of each summarised run against env steps, with the random policy's mean."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for path in summaries:
        summary = json.loads(path.read_text())
        steps, scores = map(np.array, zip(*summary["games_steps_and_scores"], strict=True))
        rolling = np.convolve(scores, np.ones(window) / window, mode="valid")
        label = f"{summary['script']} {' '.join(summary['flags'][6:])}, {summary.get('world_size', 1)} process(es)"
        ax.plot(steps[window - 1 :], rolling, label=f"{label}: {summary['final_mean_return_last_20_games']:.2f}")
    ax.axhline(summary["random_policy_mean_return"], color="tab:red", ls="--", label="random policy")
    ax.set_xlabel("environment steps (all envs of all processes, 4 frames skipped per step)")
    ax.set_ylabel(f"game score, mean of the last {window} games")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"plot: {out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--script", default="ppo_atari_envpool_torchcompile", help="a PPO Atari script of leanrl/")
    parser.add_argument("--env-id", default="Breakout-v5")
    parser.add_argument("--total-timesteps", type=int, default=500_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--random-games", type=int, default=100)
    parser.add_argument("--no-compile", action="store_true", help="run the twin without --compile")
    parser.add_argument("--processes", type=int, default=1, help="processes of a distributed script (torchrun)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "breakout_ppo_500k.png")
    parser.add_argument(
        "--compare", type=Path, nargs="+", help="JSON summaries of earlier runs: plot them, run nothing"
    )
    args = parser.parse_args()
    if args.compare:
        return compare(args.compare, args.out)
    if args.processes > 1 and "RANK" not in os.environ:
        sys.exit(launch_world(args.processes))
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", "benchmarks/atari_learning_curve.py", *sys.argv[1:]])

    made = []
    real_make = envpool.make

    def recording_make(*make_args, **make_kwargs):
        made.append(GameRecorder(real_make(*make_args, **make_kwargs)))
        return made[-1]

    envpool.make = recording_make
    script = ROOT / "leanrl" / f"{args.script}.py"
    flags = ["--env-id", args.env_id, "--total-timesteps", str(args.total_timesteps), "--seed", str(args.seed)]
    if args.script.endswith("_torchcompile") and not args.no_compile:
        flags.append("--compile")
    sys.argv = [str(script), *flags]
    start = time.perf_counter()
    try:
        run = runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit_:  # a distributed script's ranks other than 0 leave through sys.exit(0)
        if exit_.code or rank == 0:
            raise
        run = None
    wall_seconds = time.perf_counter() - start
    envpool.make = real_make

    (recorder,) = made
    gathered = gather_ranks_games(recorder.games, args.out, rank, world_size)
    if rank != 0:
        return
    # The script reports an iteration's games rank by rank, each rank's in the order they ended; a rank's env steps
    # times the world size are the global step count (the ranks step together, each with num_envs / world_size envs).
    rollout_steps = run["args"].num_envs // world_size * run["args"].num_steps
    gathered.sort(key=lambda game: ((game[1] - 1) // rollout_steps, game[0]))  # stable: each rank's order is kept
    steps, scores = map(np.array, zip(*((steps * world_size, score) for _, steps, score in gathered), strict=True))
    if list(scores) != run["episode_returns"]:
        sys.exit("the recorded game scores differ from the script's episode_returns")
    random_scores = random_policy_scores(args.env_id, args.random_games, args.seed)

    window = min(20, len(scores))  # fewer games only in a short try
    rolling = np.convolve(scores, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, scores, ".", alpha=0.25, color="tab:blue", label="a finished game")
    ax.plot(steps[window - 1 :], rolling, color="tab:blue", label=f"mean of the last {window} games")
    ax.axhline(np.mean(random_scores), color="tab:red", ls="--", label=f"random policy ({args.random_games} games)")
    ax.set_xlabel(f"environment steps ({run['args'].num_envs} envs, 4 frames skipped per step)")
    ax.set_ylabel("game score (unclipped, all lives)")
    world = f", {world_size} processes" if world_size > 1 else ""
    title = f"{args.script}.py {' '.join(flags[6:])} on {args.env_id}, seed {args.seed}{world}"
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=10)
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)

    summary = {
        "command": command,
        "script": f"{args.script}.py",
        "flags": flags,
        "world_size": world_size,
        "games": len(scores),
        "final_mean_return_last_20_games": float(np.mean(scores[-20:])),
        "random_policy_mean_return": float(np.mean(random_scores)),
        "random_policy_games": len(random_scores),
        "wall_seconds": wall_seconds,
        "plot": str(args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out),
        "games_steps_and_scores": [[int(step), float(score)] for step, score in zip(steps, scores, strict=True)],
    }
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
