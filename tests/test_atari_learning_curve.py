"""Tests of benchmarks/atari_learning_curve.py on a tiny budget: one process, and a world of two through torchrun."""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, describe

TOOL = REPO_ROOT / "benchmarks" / "atari_learning_curve.py"
NUM_ENVS, NUM_STEPS, TOTAL = 8, 128, 4096  # the scripts' default envs and rollout: 4 iterations


@pytest.mark.parametrize("processes", [1, 2])
def test_records_every_game_at_its_global_step(processes, tmp_path):
    """The summary lists the script's games (the tool checks them against its episode_returns, or fails) at the
    global step each ended, a multiple of the envs stepped together; the last-20 mean is the script's final return;
    the plot is written."""
    out = tmp_path / "curve.png"
    command = [sys.executable, str(TOOL), "--script", "ppo_atari_envpool_distributed", "--processes", str(processes),
               "--env-id", "Asterix-v5", "--total-timesteps", str(TOTAL), "--random-games", "2", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    completed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, describe(completed)
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["world_size"] == processes
    games = summary["games_steps_and_scores"]
    assert len(games) == summary["games"] >= 3, games
    steps = [step for step, _ in games]
    assert all(step % NUM_ENVS == 0 and 0 < step <= TOTAL for step in steps), steps
    iterations = [(step - 1) // (NUM_ENVS * NUM_STEPS) for step in steps]
    assert iterations == sorted(iterations), "games out of the order of the iterations they ended in"
    final = re.search(r"final return ([\d.]+)", completed.stdout).group(1)
    assert f"{summary['final_mean_return_last_20_games']:.1f}" == final, (summary, completed.stdout[-500:])
    assert out.stat().st_size > 0
    assert not list(tmp_path.glob(".*rank*")), "rank files left behind"


def test_compare_plots_earlier_runs_and_runs_nothing(tmp_path):
    """--compare draws the curves of summaries written before: a PNG, and no script run (no progress bar)."""
    summary = {"script": "ppo_atari_envpool_distributed.py", "flags": ["--env-id", "Breakout-v5", "--total-timesteps",
               "4096", "--seed", "1"], "final_mean_return_last_20_games": 3.0, "random_policy_mean_return": 1.5,
               "games_steps_and_scores": [[8 * (i + 1), float(i % 5)] for i in range(30)]}  # fmt: skip
    paths = []
    for world_size in (1, 2):
        paths.append(tmp_path / f"world{world_size}.json")
        paths[-1].write_text(json.dumps({**summary, "world_size": world_size}))
    out = tmp_path / "worlds.png"
    completed = subprocess.run([sys.executable, str(TOOL), "--compare", *map(str, paths), "--out", str(out)],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert completed.returncode == 0, describe(completed)
    assert completed.stdout.strip() == f"plot: {out}" and "it/s" not in completed.stderr, describe(completed)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
