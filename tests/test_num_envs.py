"""SAC and TD3 on several envs at once (--num-envs) and with several gradient steps an iteration (--gradient-steps).

One env (the default) is the run it was before these flags: tests/num_envs_1_reference.json holds what the
checkpoint, the returns and the eval return of each script's tiny run were at commit 1af5c19, before --num-envs: a
sum, a sum of absolute values, a root of the sum of squares and a signed sum of each float tensor, and a SHA-256 of
the others (the random generators' states, the step counts). They are compared exactly where any host computes them
alike, and within a tolerance where the CPU kernels of another host round differently (the compiled ones, and
matrix products whose kernels depend on the vector instructions). It was written on a 2-core AMD EPYC (AVX2), where
the runs agree with it bit for bit, by this file's __main__ block as of commit aeaebb7 (git show
aeaebb7:tests/test_num_envs.py), run on a checkout of 1af5c19's leanrl/.

With several envs: the runs count env steps, the replay buffer takes an iteration's transitions as rows (the plain
and the twin buffer alike, wrapping around), and a vector run resumes and refuses a checkpoint of another --num-envs
or --gradient-steps. (The twins' learning tests, in test_sac_td3.py, run on 4 envs.)
"""

import hashlib
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from checks import (
    assert_same_state,
    check_bad_input_in_process,
    check_resume_continues_the_run,
)
from helpers import load_checkpoint, load_script, one_torch_thread, read_results, run_in_process

REFERENCE = Path(__file__).parent / "num_envs_1_reference.json"
PLAINS = ("sac_continuous_action", "td3_continuous_action")
# Each script of the pairs, the twins also compiled: (script, flags).
VARIANTS = {
    f"{plain}{twin}{' --compile' if compiled else ''}": (plain + twin, ("--compile",) if compiled else ())
    for plain in PLAINS
    for twin, compiled in (("", False), ("_torchcompile", False), ("_torchcompile", True))
}
# 600 steps, learning from step 450, in a 500-transition buffer: the buffer wraps around and 150 updates run. Few
# enough that the runs of two hosts, whose CPU kernels round differently, stay close enough for a tolerance to tell
# them from a run that differs (with 400 updates, the compiled twin's episodes and SAC's actor drifted 1e-3 and 1e-2
# from the eager twin's).
TINY = ("--env-id", "Pendulum-v1", "--seed", "1", "--total-timesteps", "600", "--learning-starts", "450",
        "--buffer-size", "500", "--batch-size", "32", "--eval-episodes", "1")  # fmt: skip
LEARNING_STARTS, OVERWRITTEN = 450, 100  # rows 0..99 were rewritten by steps 500..599: rows 100..449 are random steps
# Tolerances against the reference, relative (to a tensor's sum of absolute values, or to a return). Before the
# first update every number comes from seeded generators and the env (float64 numpy, whose sin and cos may differ in
# the last bit between hosts): RANDOM_RTOL. After it, a host's rounding moves the run: the eager and the compiled
# twin's runs, one host's two roundings of the same run, are at most 6.6e-6 apart (an Adam moment of SAC; returns
# 1e-7), where another run (the plain script's, which draws its batches otherwise) is 1.1 (TD3) and 7.4 (SAC) away in
# its furthest entry, and its returns 3 to 30%.
RANDOM_RTOL, LEARNED_RTOL = 1e-6, 1e-3
# Adam's first moments hold the last few batches' gradients, where a host's rounding can flip which of two close Q
# values is the smaller for a sample, so its gradient comes through the other critic: on a 2-core Xeon (AVX-512) the
# plain SAC's actor moments were 1.6e-2 from the reference, its returns 7e-9 and every other entry under 6e-4; a run of
# seed 2 instead of 1 has moments 2.2e-2 to 10 from it.
MOMENT_RTOL = 5e-2


def values(checkpoint):
    """{entry path: what the comparison needs} for every entry of a checkpoint but its hyper-parameters (the flags it
    was made with, which gained num_envs and gradient_steps): a float tensor's dtype, shape, sum, sum of absolute
    values, root of the sum of squares and a signed sum (each entry times a fixed random sign: the order of the
    entries counts); another tensor's dtype, shape and SHA-256 (integers: random generators' states, step counts,
    which agree on every host); a float (an episode's return) itself; anything else, its repr. The replay rows of
    random steps are summed apart."""
    entries = {}

    def walk(value, where):
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}/{key}")
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]")
        elif isinstance(value, torch.Tensor) and value.is_floating_point():
            array = value.detach().cpu().double().numpy()
            signs = np.random.default_rng(0).choice([-1.0, 1.0], array.size)
            entries[where] = dict(dtype=str(value.dtype), shape=list(value.shape), sum=array.sum(),
                                  l1=np.abs(array).sum(), l2=np.sqrt((array**2).sum()),
                                  signed=(signs * array.ravel()).sum())  # fmt: skip
            if where.startswith("/replay_buffer/") and not where.endswith("[random steps]"):
                walk(value[OVERWRITTEN:LEARNING_STARTS], f"{where}[random steps]")
        elif isinstance(value, torch.Tensor):
            array = value.detach().cpu().numpy()
            entries[where] = f"{array.dtype} {list(array.shape)} {hashlib.sha256(array.tobytes()).hexdigest()}"
        elif isinstance(value, float):
            entries[where] = value
        else:
            entries[where] = repr(value)

    walk({key: value for key, value in checkpoint.items() if key != "hyperparameters"}, "")
    return entries


def gap(actual, expected):
    """The largest gap between two float entries' sums, relative to the expected one's sum of absolute values (its
    root of the sum of squares for that one): a tensor within rtol of the other, entry by entry, is within rtol."""
    scale = max(expected["l1"], 1e-30)
    return max(*(abs(actual[key] - expected[key]) / scale for key in ("sum", "l1", "signed")),
               abs(actual["l2"] - expected["l2"]) / max(expected["l2"], 1e-30))  # fmt: skip


def tolerance(where):
    """How far a host's rounding may move a checkpoint's float entry from the reference (relative, as in gap)."""
    if where.endswith("[random steps]"):
        return RANDOM_RTOL
    return MOMENT_RTOL if where.endswith("/exp_avg") else LEARNED_RTOL


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_env_is_the_run_before_num_envs(variant, tmp_path):
    """The run of each script on one env, the twins eager and compiled, against the run that the scripts of commit
    1af5c19, before --num-envs, made of it (tests/num_envs_1_reference.json): exactly, what any host computes alike
    (the step counts, the random generators' states after the run: as many numbers drawn from each); to
    RANDOM_RTOL, what comes before the first update (the first episode, the replay rows of random steps); to
    LEARNED_RTOL, what comes after (the other episodes, the evaluation, the networks, Adam's second moments and the
    replay rows of the learned policy), where the CPU kernels of two hosts round differently; to MOMENT_RTOL, Adam's
    first moments. On the host that wrote the reference (an AMD EPYC, AVX2) the runs agree bit for bit."""
    name, flags = VARIANTS[variant]
    reference = json.loads(REFERENCE.read_text())[variant]
    results = tmp_path / "results.jsonl"
    with one_torch_thread():  # as the reference was written
        run = run_in_process(name, *TINY, *flags, "--save-model", "--model-path", tmp_path / "agent.pt",
                             "--results-path", results)  # fmt: skip
    returns, expected_returns = run["episode_returns"], reference["episode_returns"]
    assert len(returns) == len(expected_returns) == 3
    assert returns[0] == pytest.approx(expected_returns[0], rel=RANDOM_RTOL), "the episode of random steps"
    assert returns[1:] == pytest.approx(expected_returns[1:], rel=LEARNED_RTOL), "the episodes of the learned policy"
    eval_return = read_results(results)[0]["eval_return"]
    assert eval_return == pytest.approx(reference["eval_return"], rel=LEARNED_RTOL)
    entries, expected = values(load_checkpoint(tmp_path / "agent.pt")), reference["values"]
    assert not expected.keys() - entries.keys(), "entries the run before --num-envs wrote, missing"
    exact = [
        where for where, value in expected.items() if not isinstance(value, dict | float) and entries[where] != value
    ]
    assert not exact, f"entries that differ from the run before --num-envs: {exact}"
    for where, value in expected.items():
        if isinstance(value, float):
            assert entries[where] == pytest.approx(value, rel=LEARNED_RTOL), where
    floats = {where: value for where, value in expected.items() if isinstance(value, dict)}
    for where, value in floats.items():
        assert (entries[where]["dtype"], entries[where]["shape"]) == (value["dtype"], value["shape"]), where
    far = {
        where: f"{gap(entries[where], value):.2g}"
        for where, value in floats.items()
        if gap(entries[where], value) > tolerance(where)
    }
    assert not far, f"entries further from the run before --num-envs than a host's rounding moves them: {far}"


# --- Several envs -------------------------------------------------------------------------------------------------

SCRIPTS = [plain + twin for plain in PLAINS for twin in ("", "_torchcompile")]
VECTOR = ("--env-id", "Pendulum-v1", "--num-envs", "4", "--learning-starts", "200", "--batch-size", "32")


# InvertedPendulum-v5 with a time limit of 6 steps: random and untrained policies drop the pole (a termination: the
# pole's angle past 0.2) in 3 to 6 steps about half the time, and reach the limit (a truncation) otherwise. The real
# limit, 1000 steps, would leave a test of a few hundred steps with no truncation.
SHORT_PENDULUM = "LeanrlTestShortInvertedPendulum-v5"
if SHORT_PENDULUM not in gym.registry:
    gym.register(SHORT_PENDULUM, "gymnasium.envs.mujoco.inverted_pendulum_v5:InvertedPendulumEnv", max_episode_steps=6)


@pytest.mark.parametrize("name", SCRIPTS)
def test_vector_envs_count_env_steps_and_store_each_episode_end_as_it_happened(name, tmp_path):
    """3 envs that terminate and truncate, for 298 steps: 100 iterations, 300 env steps (the budget rounded up to
    whole iterations), learning from the 51st. In each env's replay rows (every 3rd row), an episode's last transition
    holds its final observation (not the reset one that the vector env returns in its place), a termination is stored
    as one and a truncation is not, and the next transition starts from the reset observation. Checked twice: by what
    the rows show (a fallen pole in a terminal row, a reset observation, every entry within 0.01 of zero, after it),
    and by stepping a copy of each env with the actions of its rows; every episode's return is counted."""
    num_envs, seed, results = 3, 1, tmp_path / "results.jsonl"
    run = run_in_process(name, "--env-id", SHORT_PENDULUM, "--num-envs", num_envs, "--seed", seed,
                         "--total-timesteps", "298", "--learning-starts", "150", "--buffer-size", "300",
                         "--batch-size", "32", "--save-model", "--model-path", tmp_path / "agent.pt",
                         "--eval-episodes", "0", "--results-path", results)  # fmt: skip
    checkpoint = load_checkpoint(tmp_path / "agent.pt")
    assert read_results(results)[0]["steps_done"] == checkpoint["global_step"] == 300
    assert checkpoint["hyperparameters"]["num_envs"] == num_envs
    buffer = {
        key: value.numpy() for key, value in checkpoint["replay_buffer"].items() if isinstance(value, torch.Tensor)
    }
    assert len(buffer["rewards"]) == 300
    episodes = 0
    for index in range(num_envs):
        rows = {key: value[index::num_envs] for key, value in buffer.items()}  # this env's transitions, in order
        obs, next_obs = rows["observations"], rows["next_observations"]
        # What the rows show. A row whose next observation is not the next row's observation ended an episode.
        ends = np.flatnonzero(~np.isclose(next_obs[:-1], obs[1:]).all(1))
        terminated = np.flatnonzero(rows["terminations"][:-1] == 1)
        truncated = np.setdiff1d(ends, terminated)
        assert set(terminated) <= set(ends), f"env {index}: a termination that the next transition follows on from"
        assert len(terminated) >= 3 and len(truncated) >= 3, f"env {index}: {terminated}, {truncated}"
        assert (np.abs(obs[ends + 1]) <= 0.01).all(), f"env {index}: an episode's next transition starts from no reset"
        assert (np.abs(next_obs[terminated, 1]) > 0.2).all(), f"env {index}: a termination without its fallen pole"
        assert (np.abs(next_obs[truncated]).max(1) > 0.01).all(), f"env {index}: a truncation stored with a reset"
        # The same env, stepped with the actions of its rows: every row is the transition it made.
        env = gym.make(SHORT_PENDULUM)
        observation, _ = env.reset(seed=seed + index)  # as SyncVectorEnv.reset(seed=seed) seeds its env `index`
        replayed = {"terminated": [], "truncated": []}
        for t in range(100):
            where = f"{name}, env {index}, its transition {t}"
            np.testing.assert_array_equal(obs[t], observation.astype(np.float32), err_msg=where)
            observation, reward, termination, truncation, _ = env.step(rows["actions"][t])
            np.testing.assert_array_equal(next_obs[t], observation.astype(np.float32), err_msg=where)
            assert (rows["rewards"][t], rows["terminations"][t]) == (np.float32(reward), float(termination)), where
            if termination or truncation:
                replayed["terminated" if termination else "truncated"].append(t)
                observation, _ = env.reset()  # the vector env's same-step autoreset: the env's own generator
        env.close()
        episodes += len(replayed["terminated"]) + len(replayed["truncated"])
        assert {kind: [t for t in ts if t < 99] for kind, ts in replayed.items()} == {
            "terminated": terminated.tolist(),
            "truncated": truncated.tolist(),
        }, f"env {index}"
    assert len(run["episode_returns"]) == episodes


@pytest.mark.parametrize("plain", PLAINS)
def test_plain_and_twin_replay_buffers_take_the_same_rows(plain):
    """The same iterations of 3 transitions into a 10-row buffer of each script of a pair: the same rows, wrapping
    around its end, and the same checkpoint entry."""
    buffers = [
        load_script(plain).ReplayBuffer(10, 3, 2),
        load_script(plain + "_torchcompile").ReplayBuffer(10, 3, 2, "cpu"),
    ]
    rng = np.random.default_rng(0)
    for _ in range(5):  # 15 rows: the last two iterations wrap around
        obs, next_obs, actions = rng.normal(size=(3, 3)), rng.normal(size=(3, 3)), rng.normal(size=(3, 2))
        rewards, terminations = rng.normal(size=3), rng.random(3) < 0.5
        for buffer in buffers:
            buffer.add(obs, next_obs, actions, rewards, terminations)
    plain_state, twin_state = (buffer.state_dict() for buffer in buffers)
    assert plain_state["pos"] == 5 and plain_state["full"]
    assert_same_state(twin_state, plain_state, "replay buffer")
    # The last iteration's rows, 2..4 after wrapping: its rewards.
    assert torch.equal(plain_state["rewards"][2:5], torch.as_tensor(rewards, dtype=torch.float32))


@pytest.mark.parametrize("name", SCRIPTS)
def test_vector_run_resumes_and_refuses_another_num_envs(name, tmp_path, saved_checkpoints, capsys):
    flags = (*VECTOR, "--seed", "1", "--gradient-steps", "2")
    # Saved at step 240, after 10 iterations of 2 updates (learning starts at 200), and resumed to 480.
    check_resume_continues_the_run(name, flags, tmp_path, saved_checkpoints, steps=240, same_as_shorter_run=True)
    capsys.readouterr()  # what those runs printed
    for flag, value in (("--num-envs", "2"), ("--gradient-steps", "1")):
        changed = (*flags, "--total-timesteps", "480", "--resume", tmp_path / "mid.pt", flag, value)
        check_bad_input_in_process(name, changed, [flag, "hyper-parameters"], tmp_path, capsys)
