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
    """The tool's stderr if it is to fail, else the stripped cells of its table rows that match `rows`."""
    completed = subprocess.run(
        [sys.executable, str(TOOL), "--iterations", "30", "--warmup", "2", "--repeats", "1", *map(str, flags)],
        capture_output=True, text=True, timeout=600, cwd=REPO_ROOT,
    )  # fmt: skip
    assert completed.returncode == status, completed.stderr[-2000:]
    lines = [line.split("|")[1:-1] for line in completed.stdout.splitlines() if re.match(rows, line)]
    return completed.stderr if status else [[cell.strip() for cell in line] for line in lines]


def test_each_variant_against_the_envs_alone(tmp_path):
    continuous = ("ppo_continuous_action", "ppo_continuous", "HalfCheetah-v5")
    results = write_results(tmp_path / "results.jsonl", [
        result(*continuous, "plain", 1, 100.0),
        result(*continuous, "plain", 2, 300.0),
        result(*continuous, "twin+compile", 1, 150.0),
        result("pqn_atari_envpool", "pqn_atari", "Breakout-v5", "twin+compile", 1, 50.0),  # the Atari envs' pair
        result("sac_continuous_action", "sac", "HalfCheetah-v5", "plain", 1, 10.0),  # not in the PPO rows
    ])  # fmt: skip
    rows = {(row[0], row[2], row[4]): row for row in run_tool("--results", results)}
    assert set(rows) == {("ppo_continuous_action", "1", "plain"), ("ppo_continuous_action", "1", "twin+compile"),
                         ("ppo_atari_envpool", "8", "pqn_atari_envpool: twin+compile")}  # fmt: skip
    for (script, _, variant), (_, env_id, _, env_rate, _, sps, share) in rows.items():
        expected = {"plain": ("HalfCheetah-v5", "200"), "twin+compile": ("HalfCheetah-v5", "150")}  # 200: the median
        assert (env_id, sps) == expected.get(variant, ("Breakout-v5", "50")), rows
        env_steps = float(env_rate.split()[0])  # the median, then its range
        assert env_steps > 0 and abs(int(share.rstrip("%")) - 100 * int(sps) / env_steps) <= 1, (script, variant)


@pytest.mark.parametrize("flags, error", [
    pytest.param(["--results", "RESULTS"], "RESULTS, line 1: no ", id="malformed-results"),
    pytest.param(["--repeats", "0"], "--iterations and --repeats must be at least 1", id="no-repeats"),
    pytest.param(["--frames"], "--frames copies frames to a GPU: torch sees no CUDA device", id="frames-without-gpu",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine without a GPU")),
])  # fmt: skip
def test_bad_input_is_refused_in_one_line(tmp_path, flags, error):
    results = tmp_path / "results.jsonl"
    results.write_text('{"sps": 1}\n')
    err = run_tool(*[str(results) if flag == "RESULTS" else flag for flag in flags], status=2)
    assert err.startswith(f"env_speed.py: error: {error.replace('RESULTS', str(results))}") and err.count("\n") == 1


@requires_cuda
def test_frames_table_times_each_copy_against_the_envs_alone():
    """Each copy's cost is its steps' time less the envs' own (the first row), per env step, to the printed rounding."""
    header, *rows = run_tool("--scripts", "ppo_atari_envpool", "--frames", rows=r"\| (envs|\+ frames|Breakout)")
    num_envs = int(re.fullmatch(r"Breakout-v5, (\d+) envs", header[0])[1])
    assert [row[0] for row in rows] == ["envs alone", "+ frames to the GPU, pageable (torch.as_tensor)",
                                        "+ frames to the GPU, pinned (the twin's frames_to_device)"]  # fmt: skip
    rates = [float(row[1].split()[0]) for row in rows]
    assert all(rate > 0 for rate in rates), rates
    for row, rate in zip(rows, rates, strict=True):
        rounding = num_envs * 1e6 * 0.5 * (1 / rate**2 + 1 / rates[0] ** 2) + 0.5  # rates printed to 1, costs to 1 us
        assert abs(float(row[2]) - (1 / rate - 1 / rates[0]) * num_envs * 1e6) <= rounding, (row, rates[0])
