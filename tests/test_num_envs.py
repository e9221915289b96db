"""SAC and TD3 with --num-envs and --gradient-steps. One env is the run before these flags: num_envs_1_reference.json
holds summaries of each script's tiny run at commit 1af5c19, written on a 2-core AMD EPYC (AVX2), where the runs agree
bit for bit, by this file's __main__ block as of commit aeaebb7 on a checkout of 1af5c19's leanrl/."""

import hashlib
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from checks import assert_same_state, check_bad_input_in_process, check_resume_continues_the_run
from helpers import load_checkpoint, load_script, one_torch_thread, read_results, run_in_process

REFERENCE = Path(__file__).parent / "num_envs_1_reference.json"
PLAINS = ("sac_continuous_action", "td3_continuous_action")
# Each script of the pairs, the twins also compiled: (script, flags).
VARIANTS = {
    f"{plain}{twin}{' --compile' if compiled else ''}": (plain + twin, ("--compile",) if compiled else ())
    for plain in PLAINS
    for twin, compiled in (("", False), ("_torchcompile", False), ("_torchcompile", True))
}
# The buffer wraps around and 150 updates run: few enough for two hosts' roundings to stay within the tolerances.
TINY = ("--env-id", "Pendulum-v1", "--seed", "1", "--total-timesteps", "600", "--learning-starts", "450",
        "--buffer-size", "500", "--batch-size", "32", "--eval-episodes", "1")  # fmt: skip
LEARNING_STARTS, OVERWRITTEN = 450, 100  # rows 0..99 were rewritten by steps 500..599: rows 100..449 are random steps
# Relative tolerances against the reference. Before the first update (seeded draws, the env): RANDOM_RTOL. After it,
# a host's rounding moves the run: eager and compiled twins are at most 6.6e-6 apart, another run 1.1 to 7.4 in its
# furthest entry, its returns 3-30%. Adam's first moments, where rounding can flip which critic's Q is the smaller, were
# 1.6e-2 from the reference on a Xeon (AVX-512), a run of seed 2 2.2e-2 to 10.
RANDOM_RTOL, LEARNED_RTOL, MOMENT_RTOL = 1e-6, 1e-3, 5e-2


def values(checkpoint):
    """{entry path: summary} of a checkpoint but its hyper-parameters: a float tensor's dtype, shape, sum, L1, L2 and
    signed sum (a fixed random sign each entry); another tensor's SHA-256; a float itself; else its repr. The replay
    rows of random steps are summed apart."""
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
    """The largest gap between two float entries' sums, relative to the expected L1 (L2 for the L2)."""
    scale = max(expected["l1"], 1e-30)
    return max(*(abs(actual[key] - expected[key]) / scale for key in ("sum", "l1", "signed")),
               abs(actual["l2"] - expected["l2"]) / max(expected["l2"], 1e-30))  # fmt: skip


def tolerance(where):
    if where.endswith("[random steps]"):
        return RANDOM_RTOL
    return MOMENT_RTOL if where.endswith("/exp_avg") else LEARNED_RTOL


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_env_is_the_run_before_num_envs(variant, tmp_path):
    """Each script's run on one env (the twins eager and compiled) is the reference's: exactly where every host agrees
    (step counts, generators' states), else to the tolerance of what a host's rounding moves."""
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
    gaps = {where: gap(entries[where], value) for where, value in floats.items()}
    far = {where: f"{value:.2g}" for where, value in gaps.items() if value > tolerance(where)}
    assert not far, f"entries further from the run before --num-envs than a host's rounding moves them: {far}"


SCRIPTS = [plain + twin for plain in PLAINS for twin in ("", "_torchcompile")]
VECTOR = ("--env-id", "Pendulum-v1", "--num-envs", "4", "--learning-starts", "200", "--batch-size", "32")


# InvertedPendulum-v5 cut at 6 steps: about half the episodes terminate (the pole past 0.2 rad), the rest truncate.
SHORT_PENDULUM = "LeanrlTestShortInvertedPendulum-v5"
if SHORT_PENDULUM not in gym.registry:
    gym.register(SHORT_PENDULUM, "gymnasium.envs.mujoco.inverted_pendulum_v5:InvertedPendulumEnv", max_episode_steps=6)


@pytest.mark.parametrize("name", SCRIPTS)
def test_vector_envs_count_env_steps_and_store_each_episode_end_as_it_happened(name, tmp_path):
    """3 envs, 298 steps rounded up to 300: in each env's replay rows an episode's last transition holds its final
    observation, a termination (not a truncation) is stored as one, and the next row starts from the reset; checked by
    what the rows show and by replaying each env with its rows' actions. Every episode's return is counted."""
    num_envs, seed, results = 3, 1, tmp_path / "results.jsonl"
    run = run_in_process(name, "--env-id", SHORT_PENDULUM, "--num-envs", num_envs, "--seed", seed,
                         "--total-timesteps", "298", "--learning-starts", "150", "--buffer-size", "300",
                         "--batch-size", "32", "--save-model", "--model-path", tmp_path / "agent.pt",
                         "--eval-episodes", "0", "--results-path", results)  # fmt: skip
    checkpoint = load_checkpoint(tmp_path / "agent.pt")
    assert read_results(results)[0]["steps_done"] == checkpoint["global_step"] == 300
    assert checkpoint["hyperparameters"]["num_envs"] == num_envs
    buffer = {key: value.numpy() for key, value in checkpoint["replay_buffer"].items() if torch.is_tensor(value)}
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
        shown = {"terminated": terminated.tolist(), "truncated": truncated.tolist()}  # what the rows show
        assert {kind: [t for t in ts if t < 99] for kind, ts in replayed.items()} == shown, f"env {index}"
    assert len(run["episode_returns"]) == episodes


@pytest.mark.parametrize("plain", PLAINS)
def test_plain_and_twin_replay_buffers_take_the_same_rows(plain):
    """Iterations of 3 transitions into a 10-row buffer of each script of a pair: the same rows, wrapping around."""
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
    assert torch.equal(plain_state["rewards"][2:5], torch.as_tensor(rewards, dtype=torch.float32))


@pytest.mark.parametrize("name", SCRIPTS)
def test_vector_run_resumes_and_refuses_another_num_envs(name, tmp_path, saved_checkpoints, capsys):
    flags = (*VECTOR, "--seed", "1", "--gradient-steps", "2")
    check_resume_continues_the_run(name, flags, tmp_path, saved_checkpoints, steps=240, same_as_shorter_run=True)
    capsys.readouterr()  # what those runs printed
    for flag, value in (("--num-envs", "2"), ("--gradient-steps", "1")):
        changed = (*flags, "--total-timesteps", "480", "--resume", tmp_path / "mid.pt", flag, value)
        check_bad_input_in_process(name, changed, [flag, "hyper-parameters"], tmp_path, capsys)
