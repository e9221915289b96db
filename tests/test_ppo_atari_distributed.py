"""Tests of the distributed PPO Atari pair: leanrl/ppo_atari_envpool_distributed.py (plain) and its twin
ppo_atari_envpool_distributed_torchcompile.py, on the CPU with gloo.

A world of one (a plain `python` launch) runs in this process. Worlds of two run through torchrun
(`python -m torch.distributed.run --standalone`), each rank in tests/distributed_worker.py, which saves what the
ranks computed for the tests to compare: with the same global minibatch split over two ranks, the synced gradient is
the single-process gradient of the whole minibatch; after a run, every rank holds the same parameters while its
envs played other games.
"""

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
import torch
import torch.distributed as dist
from checks import (
    SameUpdates,
    assert_leaves_close,
    assert_same_state,
    check_a_second_build_computes_with_its_own_hyperparameters,
    check_bad_input_in_process,
    check_bf16_update_is_fp32_within_rounding,
    check_resume_continues_the_run,
    detached,
    sync_,
)
from distributed_worker import GLOBAL_MINIBATCH
from helpers import (
    DEVICES,
    REPO_ROOT,
    args_fields,
    built,
    default_dtype,
    describe,
    field_default,
    is_number,
    load_checkpoint,
    load_script,
    one_torch_thread,
    read_results,
    run_in_process,
    script_path,
)
from test_ppo_atari import NUM_ACTIONS, build, call_update, ppo_compiled_calls, random_minibatch

PLAIN = "ppo_atari_envpool_distributed"
TWIN = "ppo_atari_envpool_distributed_torchcompile"
SCRIPTS = (PLAIN, TWIN)
SINGLE_PROCESS = {PLAIN: "ppo_atari_envpool", TWIN: "ppo_atari_envpool_torchcompile"}
WORKER = REPO_ROOT / "tests" / "distributed_worker.py"

# Asterix: 3 lives, rewards of 50 and more, games of about 200-350 steps under a near-uniform policy: games end in
# these short runs (the single-process pair's tests use the same game for that reason).
WORLD_OF_ONE_RUN = ("--env-id", "Asterix-v5", "--num-envs", "2", "--num-steps", "128", "--total-timesteps", "1536",
                    "--num-minibatches", "2", "--update-epochs", "1", "--seed", "1")  # fmt: skip
# A world of two: 2 envs a rank, 4 iterations of 4 x 64 steps, 2 epochs of 2 minibatches each.
WORLD_OF_TWO_RUN = ("--env-id", "Asterix-v5", "--num-envs", "4", "--num-steps", "64", "--total-timesteps", "1024",
                    "--num-minibatches", "2", "--update-epochs", "2", "--seed", "1")  # fmt: skip
ITERATIONS, EPOCHS, MINIBATCHES = 4, 2, 2
SAVED_AND_EVALUATED = ("--save-model", "--eval-episodes", "1")


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def torchrun(*args, nproc=2, timeout=600):
    """python -m torch.distributed.run with nproc ranks on this machine, one thread each, on the CPU."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               *map(str, args)]  # fmt: skip
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def ranks_output(out, mode):
    return [torch.load(out / f"{mode}_rank{rank}.pt", map_location="cpu", weights_only=False) for rank in (0, 1)]


@pytest.fixture(params=DEVICES)
def world_of_one(request):
    """The device, in a process group of this process alone, as a plain launch makes it: gloo, or NCCL on CUDA."""
    dist.init_process_group("nccl" if request.param == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield request.param
    dist.destroy_process_group()


# --- 1. A world of one is the single-process script, bit for bit ------------------------------------------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_world_of_one_is_the_single_process_script(name):
    """Plain vs plain and twin vs twin, same flags and seed: the same games, the same final parameters, exactly. The
    all-reduces of a world of one are identities, and the global means are the single process's means."""
    single = run_in_process(SINGLE_PROCESS[name], *WORLD_OF_ONE_RUN)
    world = run_in_process(name, *WORLD_OF_ONE_RUN)
    assert len(single["episode_returns"]) >= 3, single["episode_returns"]
    assert world["episode_returns"] == single["episode_returns"]
    world_agent, single_agent = built(world["ppo"], "agent"), built(single["ppo"], "agent")
    assert_same_state(world_agent.state_dict(), single_agent.state_dict(), "final parameters")
    assert_same_state(world["ppo"].optimizer.state_dict()["state"], single["ppo"].optimizer.state_dict()["state"],
                      "Adam's state")  # fmt: skip


# --- 2. Two ranks: the synced gradient is the whole global minibatch's -------------------------------------------


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
    """A global minibatch of 16 steps, a quarter of them masked out (unevenly between the halves), split in two:
    after the all-reduce, each rank's gradient is the gradient that the single-process script computes on all 16
    steps, and the losses summed over ranks are its losses. Local means (a rank's own count, its own advantage
    statistics) or a missing all-reduce would give other gradients."""
    rank0, rank1 = (ranks[name, norm_adv] for ranks in gradient_ranks)
    batch = rank0["batch"]
    half = GLOBAL_MINIBATCH // 2
    assert batch["mask"][:half].sum() != batch["mask"][half:].sum(), "even masks: local means would pass"
    # The ranks seeded their generators differently: equal parameters come from rank 0's broadcast.
    assert_same_state(rank1["initial"], rank0["initial"], "parameters of rank 1 and rank 0 before the update")
    assert_same_state(rank1["gradients"], rank0["gradients"], "synced gradients of rank 1 and rank 0")

    single = load_script(SINGLE_PROCESS[PLAIN])
    with default_dtype(torch.float64):  # as the ranks computed (see distributed_worker.py)
        ppo = single.build_ppo(NUM_ACTIONS, single.Args(norm_adv=norm_adv, max_grad_norm=1e9), torch.device("cpu"))
        agent = built(ppo, "agent")
        agent.load_state_dict(rank0["initial"])
        losses = call_update(ppo, SINGLE_PROCESS[PLAIN], batch)
    for key, gradient in rank0["gradients"].items():
        expected = dict(agent.named_parameters())[key].grad
        scale = expected.abs().max().item()
        assert scale > 0, key
        torch.testing.assert_close(gradient, expected, rtol=1e-4, atol=1e-5 * scale, msg=lambda m, k=key: f"{k}: {m}")
    assert_leaves_close(rank0["losses"], {key: value.detach() for key, value in losses.items()}, "losses")


# --- 3. A run of two ranks ------------------------------------------------------------------------------------


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
            assert "a world of 2 process(es) (gloo), each with 2 envs and 1 thread(s)" in completed.stdout, describe(
                completed
            )
            cache[name, flags] = ranks_output(out, "run"), out
        return cache[name, flags]

    return run


@pytest.mark.parametrize("name", SCRIPTS)
def test_ranks_keep_the_same_parameters_while_playing_other_games(name, run_ranks):
    """After 4 iterations the two ranks hold the same parameters and Adam step counts, and report the same (global)
    returns, while their envs, seeded as envs 0-1 and 2-3 of a single process, saw other frames. (The run saves and
    evaluates its agent after training, as test_rank_zero_alone_writes_results_and_checkpoint... needs: one world of
    two serves both.)"""
    (rank0, rank1), _ = run_ranks(name, *SAVED_AND_EVALUATED)
    assert rank0["status"] == rank1["status"] == 0
    # Rank 0 alone then makes the evaluation env, seeded apart from every training env.
    assert (rank0["env_seeds"], rank1["env_seeds"]) == ([1, 1 + run_utils.EVAL_SEED_OFFSET], [3])
    assert not torch.equal(rank0["rollout_obs"], rank1["rollout_obs"]), "both ranks saw the same frames"
    assert_same_state(rank1["params"], rank0["params"], "parameters of rank 1 and rank 0")
    assert rank0["optimizer_steps"] == rank1["optimizer_steps"] == [ITERATIONS * EPOCHS * MINIBATCHES]
    assert rank0["episode_returns"] == rank1["episode_returns"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_tiny_target_kl_stops_both_ranks_after_the_same_minibatch(name, run_ranks):
    """--target-kl 1e-12 is exceeded by the first epoch of every update: both ranks stop their epochs there, with the
    same number of steps (the KL checked is the global minibatch's, summed over ranks), and no rank hangs."""
    (rank0, rank1), _ = run_ranks(name, "--target-kl", "1e-12")
    assert rank0["status"] == rank1["status"] == 0
    assert rank0["optimizer_steps"] == rank1["optimizer_steps"] == [ITERATIONS * MINIBATCHES]
    assert_same_state(rank1["params"], rank0["params"], "parameters of rank 1 and rank 0")


def test_rank_zero_alone_writes_results_and_a_single_process_checkpoint(run_ranks, tmp_path):
    """One results line (rank 0's) with world_size 2 and the global step count; one checkpoint, in the layout of the
    single-process pair: the single-process plain script evaluates it (a finished run: it trains nothing) with the
    eval return the world of two reported, and saves back every entry it read unchanged."""
    _, out = run_ranks(PLAIN, *SAVED_AND_EVALUATED)
    (result,) = read_results(out / "results.jsonl")
    assert result["world_size"] == 2 and result["steps_done"] == ITERATIONS * 4 * 64, result
    assert result["script"] == f"{PLAIN}.py" and result["model_path"] == str(out / "agent.pt"), result
    assert is_number(result["sps"]) and is_number(result["final_return"]) and is_number(result["eval_return"]), result
    checkpoint = load_checkpoint(out / "agent.pt")
    assert checkpoint["world_size"] == 2 and len(checkpoint["rank_rngs"]) == 1

    results = tmp_path / "results.jsonl"
    run_in_process(SINGLE_PROCESS[PLAIN], *WORLD_OF_TWO_RUN, "--resume", out / "agent.pt", "--save-model",
                   "--model-path", tmp_path / "agent.pt", "--eval-episodes", "1",
                   "--results-path", results)  # fmt: skip
    (evaluated,) = read_results(results)
    assert evaluated["eval_return"] == result["eval_return"]
    assert evaluated["steps_done"] == result["steps_done"]
    resaved = load_checkpoint(tmp_path / "agent.pt")
    for key in ("agent", "global_step", "iteration", "hyperparameters", "recent_returns"):
        assert_same_state(resaved[key], checkpoint[key], key)


TINY_FLAGS = ("--env-id", "Breakout-v5", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "1",
              "--update-epochs", "1")  # fmt: skip
BATCH_STEPS = 32  # steps of an iteration of TINY_FLAGS


@pytest.mark.parametrize("name", SCRIPTS)
def test_resume_continues_a_world_of_one(name, tmp_path, saved_checkpoints):
    """Saved after 2 of 4 iterations and resumed: the run ends as the uninterrupted one (steps, iterations, Adam's
    step counts); the checkpoint holds the world size and no other rank's generators."""
    resumed = check_resume_continues_the_run(name, TINY_FLAGS, tmp_path, saved_checkpoints, steps=2 * BATCH_STEPS,
                                             same_as_shorter_run=False)  # fmt: skip
    assert resumed["iteration"] == 4 and resumed["world_size"] == 1 and resumed["rank_rngs"] == []


def test_envs_of_a_rank_are_those_of_a_single_process():
    """envpool seeds env i of a pool with seed + i: rank r's pool, seeded seed + r * envs a rank, plays what a single
    process's envs r * envs a rank, ... play (the same frames for the same actions). A pool seeded one off does not."""
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


# --- 4. The twin computes what the plain script does, compiled or not (a world of one) ---------------------------


def update(ppo, name, batch):
    """A distributed script's update takes the minibatch as its single-process counterpart's does."""
    return detached(call_update(ppo, SINGLE_PROCESS[name], batch))


@pytest.mark.parametrize(
    ("name", "overrides"), [(PLAIN, {}), (TWIN, {"compile": True})], ids=["twin-vs-plain", "compiled-vs-eager-twin"]
)
def test_twin_updates_match(name, overrides, world_of_one, inductor_fallback_random):
    """Three updates from the same parameters on the same minibatches: the eager twin's gradients, steps and losses
    are the plain script's, and the compiled twin's are the eager twin's (SameUpdates, checks.py)."""
    device = world_of_one
    reference, other = build(load_script(name), device), build(load_script(TWIN), device, **overrides)
    sync_(other.agent, reference.agent)
    check = SameUpdates("update")
    for round_ in range(3):
        batch = random_minibatch(seed=400 + round_, device=device)
        expected, actual = update(reference, name, batch), update(other, TWIN, batch)
        assert_leaves_close(actual, expected, f"round {round_} losses")
        lr = float(reference.optimizer.param_groups[0]["lr"])
        check.check(other.agent, reference.agent, lr, f"round {round_}")
        reference.set_learning_rate(lr * 0.5)
        other.set_learning_rate(lr * 0.5)


def test_twin_bf16_update_and_values_are_fp32_within_rounding(world_of_one):
    module = load_script(TWIN)
    check_bf16_update_is_fp32_within_rounding(
        lambda **overrides: build(module, world_of_one, **overrides),
        lambda ppo, batch: update(ppo, TWIN, batch),
        lambda ppo: ppo.agent,
        [random_minibatch(seed=500, device=world_of_one), random_minibatch(seed=501, device=world_of_one)],
        lambda ppo, obs: ppo.value(obs),
    )


def test_twin_built_again_computes_with_its_own_hyperparameters(world_of_one, inductor_fallback_random):
    compiled_calls = lambda module, **overrides: ppo_compiled_calls(module, world_of_one, **overrides)  # noqa: E731
    check_a_second_build_computes_with_its_own_hyperparameters(TWIN, compiled_calls)


# --- 5. Flags, bad input, a lost rank, signals -----------------------------------------------------------------


def test_args_are_those_of_the_single_process_pair():
    """Both scripts have exactly the single-process pair's flags, with the same defaults (--num-envs is the number of
    envs over all ranks). (The pair's own match: test_scripts.py.)"""
    for name in SCRIPTS:
        fields, single_fields = args_fields(load_script(name)), args_fields(load_script(SINGLE_PROCESS[name]))
        assert list(fields) == list(single_fields)
        for field in fields:
            if field != "exp_name":
                assert field_default(fields[field]) == field_default(single_fields[field]), field


BAD_WORLD_SIZES = [
    (("--num-envs", "3"), ["world of 2", "--num-envs 3"]),
    (("--num-envs", "2", "--num-steps", "3", "--num-minibatches", "2"), ["--num-minibatches", "each of the 2"]),
]
BAD_INPUTS = [
    (("--env-id", "NoSuchGame-v5"), ["NoSuchGame-v5"]),
    (("--env-id", "CartPole-v1"), ["Atari", "CartPole-v1"]),
    (("--num-envs", "0"), ["--num-envs", ">= 1"]),
    (("--num-minibatches", "3"), ["--num-minibatches", "divide"]),
]


@pytest.mark.parametrize(("flags", "words"), BAD_WORLD_SIZES, ids=["num-envs", "minibatches"])
@pytest.mark.parametrize("name", SCRIPTS)
def test_bad_world_size_exits_2_with_one_line(name, flags, words, tmp_path, capsys, monkeypatch):
    """Rank 0 of a world of 2 (torchrun's variables): the check comes before the ranks meet."""
    for variable, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(variable, value)
    check_bad_input_in_process(name, flags, words, tmp_path, capsys)


@pytest.mark.parametrize(("flags", "words"), BAD_INPUTS, ids=["unknown-env", "not-atari", "num-envs", "minibatches"])
@pytest.mark.parametrize("name", SCRIPTS)
def test_bad_input_exits_2_with_one_line(name, flags, words, tmp_path, capsys):
    check_bad_input_in_process(name, flags, words, tmp_path, capsys)


def test_bad_world_size_under_torchrun_names_rank_zero_and_its_line(tmp_path):
    """Under torchrun: rank 0's one line, and torchrun's report names rank 0 and its exit status 2 as the cause
    (torchrun itself exits 1, with its own report)."""
    results = tmp_path / "results.jsonl"
    completed = torchrun(script_path(PLAIN), "--num-envs", "3", "--results-path", results, timeout=300)
    assert completed.returncode != 0, describe(completed)
    assert f"{PLAIN}.py: error: a world of 2 processes cannot share --num-envs 3 evenly" in completed.stderr
    report = completed.stderr[completed.stderr.index("Root Cause") :]
    assert "rank      : 0" in report and "exitcode  : 2" in report, report
    assert not results.exists()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_lost_rank_ends_the_others_with_one_line(tmp_path):
    """Two ranks started by hand (no torchrun to stop the others): rank 1 is killed mid-run; rank 0 exits, with an
    error status and one line saying it lost another rank, not a traceback or a hang. (It notices the closed
    connection at its next collective; the wait's bound is under the 5 minutes of COLLECTIVE_TIMEOUT, so a rank that
    waited the timeout out would fail it.)"""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}  # fmt: skip
    # The last --total-timesteps counts: a run long enough to be killed in.
    command = [sys.executable, str(script_path(PLAIN)), *WORLD_OF_TWO_RUN, "--total-timesteps", "1000000"]
    stderr_paths = [tmp_path / f"rank{rank}.txt" for rank in (0, 1)]
    processes = []
    try:
        for rank, stderr_path in enumerate(stderr_paths):
            with open(stderr_path, "w") as stderr:
                processes.append(subprocess.Popen(command, cwd=REPO_ROOT, env={**env, "RANK": str(rank)},
                                                  stdout=subprocess.DEVNULL, stderr=stderr))  # fmt: skip
        deadline = time.monotonic() + 300
        # Rank 0's progress bar shows steps done: both ranks are in the training loop.
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
    assert len(lines) == 1 and f"{PLAIN}.py: error: lost another rank: " in lines[0], lines


# The flags of the pair, --help, the results line, every flag combination of the twin and a signal to a world of one:
# test_scripts.py.


# --- run.sh's tiny run of the pair: the results line, every flag combination of the twin (test_scripts.py's checks) ---
