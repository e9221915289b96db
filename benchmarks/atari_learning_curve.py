"""Learning evidence for PPO on Atari: one run's return curve against a random policy, as a PNG and a JSON summary.

It runs a PPO Atari script in this process and records, beside it, every step envpool makes: each finished game's
unclipped score (all lives) and the env steps done when it ended. The recorded scores must equal the script's own
`episode_returns`, so the curve is the script's report, step-stamped. A uniformly random policy plays the same
game with the same env settings for the baseline.

    python benchmarks/atari_learning_curve.py --total-timesteps 500000 --out docs/breakout_ppo_500k.png
"""

import argparse
import json
import runpy
import sys
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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--script", default="ppo_atari_envpool_torchcompile", help="a PPO Atari script of leanrl/")
    parser.add_argument("--env-id", default="Breakout-v5")
    parser.add_argument("--total-timesteps", type=int, default=500_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--random-games", type=int, default=100)
    parser.add_argument("--no-compile", action="store_true", help="run the twin without --compile")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "breakout_ppo_500k.png")
    args = parser.parse_args()
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
    run = runpy.run_path(str(script), run_name="__main__")
    wall_seconds = time.perf_counter() - start
    envpool.make = real_make

    (recorder,) = made
    steps, scores = map(np.array, zip(*recorder.games, strict=True))
    if list(scores) != run["episode_returns"]:
        sys.exit("the recorded game scores differ from the script's episode_returns")
    random_scores = random_policy_scores(args.env_id, args.random_games, args.seed)

    window = 20
    rolling = np.convolve(scores, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, scores, ".", alpha=0.25, color="tab:blue", label="a finished game")
    ax.plot(steps[window - 1 :], rolling, color="tab:blue", label=f"mean of the last {window} games")
    ax.axhline(np.mean(random_scores), color="tab:red", ls="--", label=f"random policy ({args.random_games} games)")
    ax.set_xlabel("environment steps (8 envs, 4 frames skipped per step)")
    ax.set_ylabel("game score (unclipped, all lives)")
    ax.set_title(f"{args.script}.py {' '.join(flags[6:])} on {args.env_id}, seed {args.seed}")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)

    summary = {
        "command": command,
        "script": f"{args.script}.py",
        "flags": flags,
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
