"""benchmarks/env_speed.py: it steps the PPO scripts' own envs, and divides each variant's median sps by their speed."""

import re
import subprocess
import sys

import pytest
import torch
from helpers import REPO_ROOT, requires_cuda
from test_speedup_table import result, write_results

TOOL = REPO_ROOT / "benchmarks" / "env_speed.py"


def run_tool(*flags, status=0, rows=r"\| ppo_"):
    """The tool's stderr if it is to fail, else the cells of its table rows that match `rows` (the first table's)."""
    completed = subprocess.run(
        [sys.executable, str(TOOL), "--iterations", "30", "--warmup", "2", "--repeats", "1", *map(str, flags)],
        capture_output=True, text=True, timeout=600, cwd=REPO_ROOT,
    )  # fmt: skip
    assert completed.returncode == status, completed.stderr[-2000:]
    if status:
        return completed.stderr
    return [line.split("|")[1:-1] for line in completed.stdout.splitlines() if re.match(rows, line)]


def test_each_variant_against_the_envs_alone(tmp_path):
    continuous = ("ppo_continuous_action", "ppo_continuous", "HalfCheetah-v5")
    results = write_results(
        tmp_path / "results.jsonl",
        [
            result(*continuous, "plain", 1, 100.0),
            result(*continuous, "plain", 2, 300.0),
            result(*continuous, "twin+compile", 1, 150.0),
            result("pqn_atari_envpool", "pqn_atari", "Breakout-v5", "twin+compile", 1, 50.0),  # the Atari envs' pair
            result("sac_continuous_action", "sac", "HalfCheetah-v5", "plain", 1, 10.0),  # not in the PPO rows
        ],
    )
    rows = run_tool("--results", results)
    assert len(rows) == 3, rows  # two variants of continuous PPO, and the Atari envs with PQN Atari's run
    by_variant = {}
    for script, env_id, num_envs, env_rate, variant, sps, share in (map(str.strip, row) for row in rows):
        env_steps = float(env_rate.split()[0])
        assert env_steps > 0
        by_variant[(script, num_envs, variant)] = (env_id, sps, share, env_steps)
    env_id, sps, share, env_steps = by_variant[("ppo_continuous_action", "1", "plain")]
    assert (env_id, sps) == ("HalfCheetah-v5", "200")  # the median of 100 and 300
    assert abs(int(share.rstrip("%")) - 100 * 200 / env_steps) <= 1  # the table rounds the env's speed
    assert by_variant[("ppo_continuous_action", "1", "twin+compile")][1] == "150"
    env_id, sps, share, env_steps = by_variant[("ppo_atari_envpool", "8", "pqn_atari_envpool: twin+compile")]
    assert (env_id, sps) == ("Breakout-v5", "50")
    assert abs(int(share.rstrip("%")) - 100 * 50 / env_steps) <= 1


def test_malformed_results_file_is_refused_in_one_line_naming_it(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text('{"sps": 1}\n')
    err = run_tool("--results", results, status=2)
    assert err.startswith(f"env_speed.py: error: {results}, line 1: no ") and err.count("\n") == 1, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine without a GPU")
def test_frames_without_a_gpu_are_refused_in_one_line():
    err = run_tool("--frames", status=2)
    assert err == "env_speed.py: error: --frames copies frames to a GPU: torch sees no CUDA device\n", err


@requires_cuda
def test_frames_table_times_each_copy_against_the_envs_alone():
    """Each copy's cost is its steps' time less the envs' own, per step of every env: read back from the rates of the
    table's rows, each against the first row's (the envs alone), to the rounding of the printed rates."""
    rows = run_tool("--scripts", "ppo_atari_envpool", "--frames", rows=r"\| (envs|\+ frames|Breakout)")
    (header, *rows) = rows
    num_envs = int(re.fullmatch(r"Breakout-v5, (\d+) envs", header[0].strip())[1])
    assert [row[0].strip() for row in rows] == [
        "envs alone",
        "+ frames to the GPU, pageable (torch.as_tensor)",
        "+ frames to the GPU, pinned (the twin's frames_to_device)",
    ]
    rates = [float(row[1].split()[0]) for row in rows]
    assert all(rate > 0 for rate in rates), rates
    alone = rates[0]
    for row, rate in zip(rows, rates, strict=True):
        cost = float(row[2])
        rounding = num_envs * 1e6 * 0.5 * (1 / rate**2 + 1 / alone**2) + 0.5  # rates printed to 1, costs to 1 us
        assert abs(cost - (1 / rate - 1 / alone) * num_envs * 1e6) <= rounding, (row, alone)
