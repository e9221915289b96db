"""Every tool in benchmarks/ without a tests/test_<tool>.py runs here in its smallest configuration, as a user starts
it (a subprocess from the repository root). Compile configurations run with TORCH_COMPILE_DISABLE=1: the tool's
plumbing is checked in seconds; compiling is what the pairs' own tests check."""

import json
import os
import re
import runpy
import subprocess
import sys

import pytest
import run_utils
import torch
from helpers import REPO_ROOT, describe, run_in_process
from test_speedup_table import HAND_MADE, write_results

BENCHMARKS = REPO_ROOT / "benchmarks"
TESTED_HERE = {"bf16_gradients.py", "gpu_check.sh", "micro_benchmark.py", "vector_env_speed.py"}
NO_COMPILE = {"TORCH_COMPILE_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}


def run_tool(tool, *args, env=None, timeout=600):
    command = [*[sys.executable] * tool.endswith(".py"), str(BENCHMARKS / tool), *map(str, args)]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(command, cwd=REPO_ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def table_rows(text, first_cell=r"[^|-]"):
    """The cells of a markdown table's body rows (those whose first cell matches first_cell)."""
    rows = [line for line in text.splitlines() if re.match(rf"\| *{first_cell}", line)]
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows]


def test_every_tool_has_a_smoke_test():
    tools = {path for path in BENCHMARKS.iterdir() if path.suffix in (".py", ".sh") and path.name != "common.py"}
    elsewhere = {tool.name for tool in tools if (REPO_ROOT / "tests" / f"test_{tool.stem}.py").is_file()}
    assert {tool.name for tool in tools} - elsewhere == TESTED_HERE, "a tool with no test that runs it, or a stale name"


def test_micro_benchmark_times_every_algorithm_and_configuration(tmp_path):
    out = tmp_path / "micro.md"
    completed = run_tool("micro_benchmark.py", "--repeats", "1", "--calls", "1", "--out", out, env=NO_COMPILE)
    assert completed.returncode == 0, describe(completed)
    text = out.read_text()
    assert text.strip() in completed.stdout
    # --bf16: the twins that have it, where this CPU computes bf16 faster than fp32; a line says which are skipped, why.
    bf16_algos = {"sac", "td3", "ppo_atari"} if run_utils.fast_bf16(torch.device("cpu")) else set()
    update_batches, expected = {"sac": 256, "td3": 256, "ppo_continuous": 64, "dqn": 128, "ppo_atari": 256}, set()
    for algo, update_batch in update_batches.items():
        why = "has no --bf16" if algo in ("ppo_continuous", "dqn") else "does not compute bf16 faster than fp32"
        skipped = f"{algo} on cpu: skipping twin --compile --bf16: its twin"
        assert (skipped in completed.stdout and why in completed.stdout) == (algo not in bf16_algos), algo
        calls = [("act", batch) for batch in ((8,) if algo == "ppo_atari" else (1, 4, 16, 256))]
        configs = ["plain (eager)", "twin (eager)", "twin --compile", "twin --compile, cpp_wrapper"]
        configs += ["twin --compile --bf16"] * (algo in bf16_algos)
        expected |= {(algo, *call, config) for call in [*calls, ("update", update_batch)] for config in configs}
    rows = table_rows(text, r"(sac|td3|ppo_continuous|dqn|ppo_atari) \| cpu \| (act|update) \| \d")
    measured = {(algo, measure, int(batch), config) for algo, _, measure, batch, config, *_ in rows}
    assert measured == expected and len(rows) == len(expected)
    for *_, us, calls, speedup in rows:
        assert int(us) >= 0 and int(calls) > 0 and re.fullmatch(r"\d+\.\d\dx", speedup), (us, calls, speedup)
    floors = table_rows(text, r"(sac|td3|ppo_continuous|dqn|ppo_atari) \| cpu \| \d+ \| \d")
    assert [row[0] for row in floors] == list(update_batches)
    assert all(float(row[3]) > 0 for row in floors), floors  # GFLOP per update, counted


@pytest.mark.parametrize("flag", ["--repeats", "--calls"])
def test_micro_benchmark_refuses_a_count_below_one(flag, monkeypatch, capsys):
    """In this process: the tool's __main__, as its command line runs it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / "micro_benchmark.py"), flag, "0"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(BENCHMARKS / "micro_benchmark.py"), run_name="__main__")
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"micro_benchmark.py: error: {flag} must be positive"


def test_bf16_gradients_of_saved_sac_and_td3_agents(tmp_path):
    """On tiny runs' checkpoints (SAC's plain script, TD3's twin): per network, bf16's gradient near fp32's, nearer
    than fp32's on another batch, not equal (bias > 0); another algorithm's checkpoint and --batches 1 refused."""
    for script in ("sac_continuous_action", "td3_continuous_action_torchcompile"):
        checkpoint = tmp_path / f"{script}.pt"
        flags = "--env-id Pendulum-v1 --learning-starts 100 --batch-size 32 --total-timesteps 300 --eval-episodes 0"
        run_in_process(script, *flags.split(), "--save-model", "--model-path", checkpoint)
        completed = run_tool("bf16_gradients.py", checkpoint, "--batches", "4")
        assert completed.returncode == 0, describe(completed)
        rows = {row[0]: row for row in table_rows(completed.stdout, "(critic|actor)")}
        assert set(rows) == {"critic", "actor"}, rows
        for network, (_, cosines, bias, consistency, other) in rows.items():
            median = float(cosines.split()[0])
            assert 0.9 < median <= 1.0001 and median > float(other), (script, network, rows[network])
            assert float(bias) > 0 and 0 <= float(consistency) <= 1.0001, (script, network, rows[network])
    torch.save({"algo": "dqn", "global_step": 300}, tmp_path / "dqn.pt")
    for args, message in (
        ((tmp_path / "dqn.pt",), "is not a checkpoint of SAC or TD3"),
        ((checkpoint, "--batches", "1"), "--batches must be 2 or more"),
    ):
        completed = run_tool("bf16_gradients.py", *args)
        assert completed.returncode == 2 and message in completed.stderr, describe(completed)
        assert len(completed.stderr.strip().splitlines()) == 1, describe(completed)


def test_vector_env_speed_times_both_kinds():
    completed = run_tool("vector_env_speed.py", "--env-id", "Pendulum-v1", "--num-envs", "1", "2",
                         "--iterations", "20", "--warmup", "2", "--repeats", "1")  # fmt: skip
    assert completed.returncode == 0, describe(completed)
    rows = table_rows(completed.stdout, "Pendulum")
    assert [row[1] for row in rows] == ["1", "2"]
    for _, _, sync, async_, ratio in rows:
        assert float(sync.split()[0]) > 0 and float(async_.split()[0]) > 0 and ratio.endswith("x"), rows


# --- gpu_check.sh: its stages are CUDA's, but its arguments and refusals run anywhere -------------------------------


def test_gpu_check_refuses_no_arguments_and_an_unknown_stage_before_doing_anything(tmp_path):
    completed = run_tool("gpu_check.sh")
    assert completed.returncode == 2 and completed.stderr.startswith("usage: benchmarks/gpu_check.sh OUT_DIR")
    for stage in ("smok", "speedup", "speedup:x", "learning:", "tests:all"):
        completed = run_tool("gpu_check.sh", tmp_path / "out", "table", stage)
        assert completed.returncode == 2, describe(completed)
        assert completed.stderr == f"gpu_check: unknown stage '{stage}'\n", describe(completed)
        assert not (tmp_path / "out").exists(), "a refused command made its OUT_DIR"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine without a GPU")
def test_gpu_check_without_a_gpu_stops_in_one_line(tmp_path):
    completed = run_tool("gpu_check.sh", tmp_path / "out", "smoke:dqn", "speedup:1:dqn", "learning:1000", "micro")
    assert completed.returncode == 2, describe(completed)
    assert completed.stderr.endswith("gpu_check: no CUDA device seen by python3's torch\n"), describe(completed)


def test_gpu_check_table_stage_makes_the_speedup_table(tmp_path):
    """The table stage, with a python that says CUDA is there: it joins the speedup:S stages' results into one table."""
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/usr/bin/env bash\n[[ $1 == -c && $2 == *cuda.is_available* ]] && exit 0\n"
                           f'exec {sys.executable} "$@"\n')  # fmt: skip
    fake_python.chmod(0o755)
    out = tmp_path / "out"
    machine = {"cpu": "Test CPU", "cores": 2, "gpu": None, "torch": "2.13.0", "torch_threads": 1}
    for seed in (1, 2):
        (stage := out / f"speedup-seed{seed}").mkdir(parents=True)
        write_results(stage / "results.jsonl", [r for r in HAND_MADE if r["seed"] == seed])
        (stage / "machine.json").write_text(json.dumps(machine))
    completed = run_tool("gpu_check.sh", out, "table", env={"PYTHON": str(fake_python), "PATH": os.environ["PATH"]})
    assert completed.returncode == 0, describe(completed)
    assert "=== table" in completed.stdout and completed.stdout.rstrip().endswith("status 0"), describe(completed)
    joined = sorted(map(json.loads, (out / "speedup" / "results.jsonl").read_text().splitlines()), key=json.dumps)
    assert joined == sorted((r for r in HAND_MADE if r["seed"] in (1, 2)), key=json.dumps)
    assert "| sac | HalfCheetah-v5 |" in (out / "speedup" / "speedup.md").read_text()
