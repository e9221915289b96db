"""PQN Atari's own tests (what it shares with PPO Atari: test_ppo_atari.py). No learning run: Breakout learns after
100k-200k steps (docs/pqn_atari.md), past the suite's budget; the update is shown moving Q values toward their targets.
"""

import numpy as np
import pytest
import test_ppo_atari
import torch
from checks import ATOL, RTOL, check_bad_input_in_process, detached
from helpers import load_script, recorded_runs
from test_ppo_atari import BATCH, NUM_ACTIONS, PQN, PQN_TWIN, build, call_update, random_minibatch, random_rollout

SCRIPTS = (PQN, PQN_TWIN)
_one_thread = test_ppo_atari._one_thread  # the autouse fixture: one torch thread


@pytest.mark.parametrize("name", SCRIPTS)
def test_updates_move_every_q_value_toward_its_target(name):
    """Four updates on a batch with targets above Q(s, a) for actions 0-1, below for 2-3 (so that small steps can
    follow it for every sample): every Q(s, a) moves toward its target and the loss falls."""
    pqn = build(name, learning_rate=1e-3)
    batch = random_minibatch(seed=5, masked_fraction=0.0)

    def q_of_actions():
        with torch.no_grad():
            return pqn.network(batch["obs"].float()).gather(1, batch["actions"][:, None])[:, 0]

    before = q_of_actions()
    magnitudes = 0.5 + torch.rand(BATCH, generator=torch.Generator().manual_seed(6))
    offsets = torch.where(batch["actions"] < 2, 1.0, -1.0) * magnitudes
    batch["returns"] = before + offsets
    losses = [detached(call_update(pqn, name, batch)) for _ in range(4)]
    assert set(losses[0]) == {"td_loss", "q_values"}
    after = q_of_actions()
    moved = (after - before) * offsets.sign()
    assert (moved > 0).all(), f"Q values that moved away from their targets: {moved[moved <= 0]}"
    assert losses[-1]["td_loss"] < losses[0]["td_loss"]
    assert ((after - batch["returns"]) ** 2).mean() < losses[-1]["td_loss"]


def reference_q_lambda_returns(rewards, values, dones, next_value, next_done, gamma, q_lambda):
    """The lambda-return by its definition, in float64: the (1 - lambda) lambda^(n-1) weighted mix of n-step returns,
    the longest available (to the episode's end, not bootstrapped, or the rollout's) taking the rest of the weight."""
    rewards, values, dones = (np.asarray(x, dtype=np.float64) for x in (rewards, values, dones))
    values = np.concatenate([values, np.asarray(next_value, dtype=np.float64)[None]])
    dones = np.concatenate([dones, np.asarray(next_done, dtype=np.float64)[None]])
    num_steps, num_envs = rewards.shape
    returns = np.zeros((num_steps, num_envs))
    for env in range(num_envs):
        for t in range(num_steps):
            ends = [k for k in range(1, num_steps - t + 1) if dones[t + k, env]]
            longest = ends[0] if ends else num_steps - t
            n_step = [sum(gamma**k * rewards[t + k, env] for k in range(n)) + gamma**n * values[t + n, env]
                      for n in range(1, longest + 1)]  # fmt: skip
            if ends:  # observation t + longest is the episode's last: nothing is bootstrapped from it
                n_step[-1] -= gamma**longest * values[t + longest, env]
            mix = sum((1 - q_lambda) * q_lambda ** (n - 1) * n_step[n - 1] for n in range(1, longest))
            returns[t, env] = mix + q_lambda ** (longest - 1) * n_step[-1]
    return torch.tensor(returns, dtype=torch.float32)


@pytest.mark.parametrize("name", SCRIPTS)
def test_q_lambda_returns_match_the_definition(name):
    """The plain loop and the twin's scan; with lambda 0, one-step Q-learning targets."""
    compute = load_script(name).compute_q_lambda_returns
    for (num_steps, num_envs, seed), q_lambda in (((128, 8, 0), 0.65), ((37, 3, 1), 0.65), ((1, 2, 2), 0.65),
                                                  ((20, 3, 3), 0.0), ((20, 3, 4), 1.0)):  # fmt: skip
        rollout = random_rollout(num_steps, num_envs, seed)
        assert 0 < rollout["dones"].sum() or num_steps == 1
        expected = reference_q_lambda_returns(**rollout, gamma=0.99, q_lambda=q_lambda)
        actual = compute(**rollout, gamma=0.99, q_lambda=q_lambda)
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m, n=num_steps: f"T={n}: {m}")
    rollout = random_rollout(16, 4, seed=5)
    next_values = torch.cat([rollout["values"][1:], rollout["next_value"][None]])
    next_non_terminal = 1 - torch.cat([rollout["dones"][1:], rollout["next_done"][None]])
    one_step = rollout["rewards"] + 0.9 * next_non_terminal * next_values
    torch.testing.assert_close(compute(**rollout, gamma=0.9, q_lambda=0.0), one_step, rtol=RTOL, atol=ATOL)


def test_epsilon_greedy_explores_at_its_rate():
    """epsilon 0: the argmax; 1: uniform actions; 0.25: a quarter of the rows random (a quarter of those greedy)."""
    module = load_script(PQN)
    q_values = torch.randn(40_000, NUM_ACTIONS, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert torch.equal(module.epsilon_greedy(q_values, 0.0), q_values.argmax(1))
    counts = torch.bincount(module.epsilon_greedy(q_values, 1.0), minlength=NUM_ACTIONS) / len(q_values)
    torch.testing.assert_close(counts, torch.full((NUM_ACTIONS,), 1 / NUM_ACTIONS), rtol=0, atol=0.01)
    not_greedy = (module.epsilon_greedy(q_values, 0.25) != q_values.argmax(1)).float().mean()
    assert abs(not_greedy - 0.25 * 3 / 4) < 0.01, not_greedy


@pytest.mark.parametrize("name", SCRIPTS)
def test_rising_epsilon_exits_2_with_one_clear_line(name, tmp_path, capsys):
    flags, words = ("--start-e", "0.1", "--end-e", "0.5"), ("end-e", "start-e")
    check_bad_input_in_process(name, flags, words, tmp_path, capsys)


# Asterix games cut at 100 steps, in the second of two rollouts, where lives are lost too (after 65-95 steps).
NUM_ENVS, NUM_STEPS, TOTAL = 4, 64, 512
TIME_LIMIT_RUN = ("--env-id", "Asterix-v5", "--num-envs", NUM_ENVS, "--num-steps", NUM_STEPS, "--total-timesteps",
                  TOTAL, "--num-minibatches", 2, "--update-epochs", 1, "--end-e", 0.5,
                  "--exploration-fraction", 1)  # fmt: skip


@pytest.fixture(scope="module")
def recorded_run():
    """recorded_run(name): (globals, envpool steps with their epsilons) of TIME_LIMIT_RUN, seed 1, made once."""
    record = recorded_runs(TIME_LIMIT_RUN, lambda name: "epsilon_tensor" if name == PQN_TWIN else "epsilon")
    return lambda name: record(name, 1, max_episode_steps=100)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_loop_acts_with_epsilon_at_the_step_count_after_each_step(name, recorded_run):
    """CleanRL's order: each env step acts with epsilon at the step count it brings the run to (first a little under
    start-e, the last at end-e)."""
    _, steps = recorded_run(name)
    assert len(steps) == TOTAL // NUM_ENVS
    expected = [max(0.5, 1 - 0.5 * (k + 1) * NUM_ENVS / TOTAL) for k in range(len(steps))]
    assert expected[0] == pytest.approx(1 - 0.5 * NUM_ENVS / TOTAL) and expected[-1] == 0.5
    assert [step["epsilon"] for step in steps] == pytest.approx(expected, rel=0, abs=1e-6)


@pytest.mark.parametrize("name", SCRIPTS)
def test_returns_end_at_truncations_as_terminations_and_span_no_reset(name, recorded_run):
    """A truncation ends the return as a lost life does (CleanRL, the PQN paper): the last rollout's targets are their
    definition's from what the envs returned, the reward alone at an end, none depending on what follows an end; the
    reset steps are masked out."""
    run_globals, steps = recorded_run(name)
    ended = np.stack([step["life_lost"] | step["truncated"] for step in steps])
    truncated = np.stack([step["truncated"] & ~step["life_lost"] for step in steps])[-NUM_STEPS:]
    life_lost = np.stack([step["life_lost"] for step in steps])[-NUM_STEPS:]
    assert truncated.any() and life_lost.any(), "the test needs both ends in the last rollout"
    rewards = np.stack([step["clipped_reward"] for step in steps])[-NUM_STEPS:]
    dones = ended[-NUM_STEPS - 1 : -1].astype(np.float32)  # dones[t]: observation t is an episode's last frame
    if name == PQN:
        values, returns, mask = run_globals["values"], run_globals["returns"], run_globals["b_mask"].view(NUM_STEPS, -1)
    else:
        values, returns, mask = (run_globals["rollout"][key] for key in ("values", "returns", "mask"))
    next_value, next_values = run_globals["next_value"], torch.cat([values[1:], run_globals["next_value"][None]])
    assert (next_values.numpy()[truncated] != 0).all(), "a bootstrap of 0 would go unseen"
    args = run_globals["args"]
    expected = reference_q_lambda_returns(rewards, values, dones, next_value, ended[-1], args.gamma, args.q_lambda)
    torch.testing.assert_close(returns, expected, rtol=RTOL, atol=ATOL)
    ends = truncated | life_lost  # the steps that ended an episode, in the last rollout
    torch.testing.assert_close(returns[torch.as_tensor(ends)], torch.as_tensor(rewards[ends]), rtol=RTOL, atol=ATOL)
    # Junk after an end (rewards, max-Q from the episode's last frame on, the bootstrap) leaves the targets up to it.
    compute, junk = load_script(name).compute_q_lambda_returns, torch.Generator().manual_seed(0)
    rollout = dict(rewards=torch.as_tensor(rewards), values=values, dones=torch.as_tensor(dones),
                   next_value=next_value, next_done=torch.as_tensor(ended[-1], dtype=torch.float32))  # fmt: skip
    for end, env in np.argwhere(ends):
        changed = {key: value.clone() for key, value in rollout.items()}
        for key in ("rewards", "values"):
            changed[key][end + 1 :, env] = torch.randn(NUM_STEPS - end - 1, generator=junk) * 100
        changed["next_value"][env] = 100.0
        recomputed = compute(**changed, gamma=args.gamma, q_lambda=args.q_lambda)
        torch.testing.assert_close(recomputed[: end + 1, env], returns[: end + 1, env], rtol=RTOL, atol=ATOL,
                                   msg=lambda m, e=end, i=env: f"step {e}, env {i}: {m}")  # fmt: skip
        assert end == NUM_STEPS - 1 or not torch.allclose(recomputed[end + 1 :, env], returns[end + 1 :, env])
    np.testing.assert_array_equal(mask.numpy(), 1.0 - dones)
