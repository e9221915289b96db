"""The distributed PPO Atari pair in worlds of two (torchrun, gloo, each rank in tests/distributed_worker.py, which
saves what the ranks computed). A world of one is tested with the single-process pair in test_ppo_atari.py."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import envpool
import numpy as np
import pytest
import run_utils
import test_ppo_atari
import torch
from checks import assert_leaves_close, assert_same_state, check_bad_input_in_process, detached
from distributed_worker import GLOBAL_MINIBATCH
from helpers import (
    REPO_ROOT,
    args_fields,
    default_dtype,
    describe,
    field_default,
    is_number,
    load_checkpoint,
    load_script,
    read_results,
    run_in_process,
    script_path,
)
from test_ppo_atari import DISTRIBUTED, DISTRIBUTED_TWIN, PPO, build, call_update

SCRIPTS = (DISTRIBUTED, DISTRIBUTED_TWIN)
WORKER = REPO_ROOT / "tests" / "distributed_worker.py"
# Asterix (games end in short runs): 2 envs a rank, 4 iterations of 4 x 64 steps, 2 epochs of 2 minibatches each.
WORLD_OF_TWO_RUN = ("--env-id", "Asterix-v5", "--num-envs", "4", "--num-steps", "64", "--total-timesteps", "1024",
                    "--num-minibatches", "2", "--update-epochs", "2", "--seed", "1")  # fmt: skip
ITERATIONS, EPOCHS, MINIBATCHES = 4, 2, 2
SAVED_AND_EVALUATED = ("--save-model", "--eval-episodes", "1")
_one_thread = test_ppo_atari._one_thread  # the autouse fixture: one torch thread


def torchrun(*args, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *map(str, args)]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def ranks_output(out, mode):
    return [torch.load(out / f"{mode}_rank{rank}.pt", map_location="cpu", weights_only=False) for rank in (0, 1)]


@pytest.fixture(scope="module")
def gradient_ranks(tmp_path_factory):
    """Each rank's parameters before the update, its gradients after it and the losses summed over ranks."""
    out = tmp_path_factory.mktemp("gradient")
    completed = torchrun(WORKER, "gradient", out)
    assert completed.returncode == 0, describe(completed)
    return ranks_output(out, "gradient")


@pytest.mark.parametrize("norm_adv", [True, False], ids=["norm-adv", "no-norm-adv"])
@pytest.mark.parametrize("name", SCRIPTS)
def test_two_ranks_synced_gradient_is_that_of_the_whole_minibatch(name, norm_adv, gradient_ranks):
    """A global minibatch, masked unevenly, split over two ranks: after the all-reduce each rank's gradient and the
    summed losses are the single-process script's on the whole minibatch (local means would differ)."""
    rank0, rank1 = (ranks[name, norm_adv] for ranks in gradient_ranks)
    batch = rank0["batch"]
    half = GLOBAL_MINIBATCH // 2
    assert batch["mask"][:half].sum() != batch["mask"][half:].sum(), "even masks: local means would pass"
    assert_same_state(rank1["initial"], rank0["initial"], "parameters of rank 1 and rank 0 before the update")
    assert_same_state(rank1["gradients"], rank0["gradients"], "synced gradients of rank 1 and rank 0")

    with default_dtype(torch.float64):  # as the ranks computed (see distributed_worker.py)
        ppo = build(PPO, norm_adv=norm_adv, max_grad_norm=1e9)
        ppo.network.load_state_dict(rank0["initial"])
        losses = detached(call_update(ppo, PPO, batch))
    expected = dict(ppo.network.named_parameters())
    for key, gradient in rank0["gradients"].items():
        scale = expected[key].grad.abs().max().item()
        assert scale > 0, key
        torch.testing.assert_close(gradient, expected[key].grad, rtol=1e-4, atol=1e-5 * scale,
                                   msg=lambda m, k=key: f"{k}: {m}")  # fmt: skip
    assert_leaves_close(rank0["losses"], losses, "losses")


@pytest.fixture(scope="module")
def run_ranks(tmp_path_factory):
    """run_ranks(name, *flags): what each rank of a world of two ended with, and the folder of the run's files."""
    cache = {}

    def run(name, *flags):
        if (name, flags) not in cache:
            out = tmp_path_factory.mktemp("run")
            files = ("--results-path", out / "results.jsonl", "--model-path", out / "agent.pt")
            completed = torchrun(WORKER, "run", out, name, *WORLD_OF_TWO_RUN, *files, *flags)
            assert completed.returncode == 0, describe(completed)
            world = "a world of 2 process(es) (gloo), each with 2 envs and 1 thread(s)"
            assert world in completed.stdout, describe(completed)
            cache[name, flags] = ranks_output(out, "run"), out
        return cache[name, flags]

    return run


@pytest.mark.parametrize("name", SCRIPTS)
def test_ranks_keep_the_same_parameters_while_playing_other_games(name, run_ranks):
    """After 4 iterations both ranks hold the same parameters, Adam step counts and (global) returns, while their envs
    (seeded as envs 0-1 and 2-3 of a single process) saw other frames."""
    (rank0, rank1), _ = run_ranks(name, *SAVED_AND_EVALUATED)
    assert rank0["status"] == rank1["status"] == 0
    # Rank 0 alone makes the evaluation env, seeded apart from every training env.
    assert (rank0["env_seeds"], rank1["env_seeds"]) == ([1, 1 + run_utils.EVAL_SEED_OFFSET], [3])
    assert not torch.equal(rank0["rollout_obs"], rank1["rollout_obs"]), "both ranks saw the same frames"
    assert_same_state(rank1["params"], rank0["params"], "parameters of rank 1 and rank 0")
    assert rank0["optimizer_steps"] == rank1["optimizer_steps"] == [ITERATIONS * EPOCHS * MINIBATCHES]
    assert rank0["episode_returns"] == rank1["episode_returns"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_tiny_target_kl_stops_both_ranks_after_the_same_minibatch(name, run_ranks):
    """--target-kl 1e-12: both ranks stop each update after its first epoch (the global KL), and no rank hangs."""
    (rank0, rank1), _ = run_ranks(name, "--target-kl", "1e-12")
    assert rank0["status"] == rank1["status"] == 0
    assert rank0["optimizer_steps"] == rank1["optimizer_steps"] == [ITERATIONS * MINIBATCHES]
    assert_same_state(rank1["params"], rank0["params"], "parameters of rank 1 and rank 0")


def test_rank_zero_alone_writes_results_and_a_single_process_checkpoint(run_ranks, tmp_path):
    """Rank 0's results line alone (world_size 2, global steps) and one checkpoint, which the single-process script
    resumes as a finished run: the same eval return, every entry saved back unchanged."""
    _, out = run_ranks(DISTRIBUTED, *SAVED_AND_EVALUATED)
    (result,) = read_results(out / "results.jsonl")
    assert result["world_size"] == 2 and result["steps_done"] == ITERATIONS * 4 * 64, result
    assert result["script"] == f"{DISTRIBUTED}.py" and result["model_path"] == str(out / "agent.pt"), result
    assert is_number(result["sps"]) and is_number(result["final_return"]) and is_number(result["eval_return"]), result
    checkpoint = load_checkpoint(out / "agent.pt")
    assert checkpoint["world_size"] == 2 and len(checkpoint["rank_rngs"]) == 1

    results = tmp_path / "results.jsonl"
    run_in_process(PPO, *WORLD_OF_TWO_RUN, "--resume", out / "agent.pt", "--save-model",
                   "--model-path", tmp_path / "agent.pt", "--eval-episodes", "1",
                   "--results-path", results)  # fmt: skip
    (evaluated,) = read_results(results)
    assert evaluated["eval_return"] == result["eval_return"]
    assert evaluated["steps_done"] == result["steps_done"]
    resaved = load_checkpoint(tmp_path / "agent.pt")
    for key in ("agent", "global_step", "iteration", "hyperparameters", "recent_returns"):
        assert_same_state(resaved[key], checkpoint[key], key)


def test_envs_of_a_rank_are_those_of_a_single_process():
    """envpool seeds env i of a pool with seed + i: rank r's pool, seeded seed + r * envs a rank, plays the single
    process's envs from r * envs a rank on; a pool seeded one off does not."""
    actions = np.random.default_rng(0).integers(4, size=(60, 4))

    def frames(num_envs, seed, columns):
        envs = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=num_envs, episodic_life=True,
                            reward_clip=True, seed=seed)  # fmt: skip
        obs, _ = envs.reset()
        seen = [obs]
        for step_actions in actions[:, columns]:
            seen.append(envs.step(step_actions)[0])
        envs.close()
        return np.stack(seen)

    single = frames(4, 1, slice(0, 4))
    np.testing.assert_array_equal(frames(2, 1, slice(0, 2)), single[:, :2])
    np.testing.assert_array_equal(frames(2, 3, slice(2, 4)), single[:, 2:])
    assert not np.array_equal(frames(2, 2, slice(2, 4)), single[:, 2:]), "the seed does not change the games"


@pytest.mark.parametrize("name", SCRIPTS)
def test_args_are_those_of_the_single_process_pair(name):
    """Exactly the single-process script's flags, in order, with the same defaults (--num-envs over all ranks)."""
    fields, single = (args_fields(load_script(script)) for script in (name, name.replace("_distributed", "")))
    assert list(fields) == list(single)
    defaults = [{key: field_default(field) for key, field in f.items() if key != "exp_name"} for f in (fields, single)]
    assert defaults[0] == defaults[1]


BAD_WORLD_SIZES = [
    (("--num-envs", "3"), ["world of 2", "--num-envs 3"]),
    (("--num-envs", "2", "--num-steps", "3", "--num-minibatches", "2"), ["--num-minibatches", "each of the 2"]),
]


@pytest.mark.parametrize(("flags", "words"), BAD_WORLD_SIZES, ids=["num-envs", "minibatches"])
@pytest.mark.parametrize("name", SCRIPTS)
def test_bad_world_size_exits_2_with_one_line(name, flags, words, tmp_path, capsys, monkeypatch):
    """Rank 0 of a world of 2 (torchrun's variables): the check comes before the ranks meet."""
    for variable, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(variable, value)
    check_bad_input_in_process(name, flags, words, tmp_path, capsys)


def test_bad_world_size_under_torchrun_names_rank_zero_and_its_line(tmp_path):
    """Under torchrun: rank 0's one line, and torchrun's report names rank 0 and its exit status 2 as the cause."""
    results = tmp_path / "results.jsonl"
    completed = torchrun(script_path(DISTRIBUTED), "--num-envs", "3", "--results-path", results, timeout=300)
    assert completed.returncode != 0, describe(completed)
    assert f"{DISTRIBUTED}.py: error: a world of 2 processes cannot share --num-envs 3 evenly" in completed.stderr
    report = completed.stderr[completed.stderr.index("Root Cause") :]
    assert "rank      : 0" in report and "exitcode  : 2" in report, report
    assert not results.exists()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_lost_rank_ends_the_others_with_one_line(tmp_path):
    """Two ranks started by hand, rank 1 killed mid-run: rank 0 exits 1 with one line saying it lost another rank, well
    within COLLECTIVE_TIMEOUT (5 minutes): no traceback, no hang."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}  # fmt: skip
    command = [sys.executable, str(script_path(DISTRIBUTED)), *WORLD_OF_TWO_RUN, "--total-timesteps", "1000000"]
    stderr_paths = [tmp_path / f"rank{rank}.txt" for rank in (0, 1)]
    processes = []
    try:
        for rank, stderr_path in enumerate(stderr_paths):
            with open(stderr_path, "w") as stderr:
                processes.append(subprocess.Popen(command, cwd=REPO_ROOT, env={**env, "RANK": str(rank)},
                                                  stdout=subprocess.DEVNULL, stderr=stderr))  # fmt: skip
        deadline = time.monotonic() + 300
        while not re.search(r"\b[1-9]\d*/\d+\b", stderr_paths[0].read_text()):
            assert processes[0].poll() is None and time.monotonic() < deadline, stderr_paths[0].read_text()[-2000:]
            time.sleep(0.5)
        processes[1].send_signal(signal.SIGKILL)
        start = time.monotonic()
        status = processes[0].wait(timeout=240)
        print(f"rank 0 exited {time.monotonic() - start:.1f} s after rank 1 was killed")
    finally:
        for process in processes:
            process.kill()
    output = stderr_paths[0].read_text()
    assert status == 1, output[-2000:]
    assert "Traceback" not in output, output[-2000:]
    lines = [line for line in output.replace("\r", "\n").splitlines() if "error" in line]
    assert len(lines) == 1 and f"{DISTRIBUTED}.py: error: lost another rank: " in lines[0], lines
