"""PQN Atari's own tests: leanrl/pqn_atari_envpool.py (plain) and its twin pqn_atari_envpool_torchcompile.py. What it
shares with the PPO Atari pairs (masked updates, the twin against the plain script, compiled, captured and bf16
updates, bad input, the game's real returns, runs of the twin and the plain script, resuming) is tested in
test_ppo_atari.py, parametrized over the scripts.

No test here shows the agent learning: a Breakout run shows it after 100k to 200k steps (docs/pqn_atari.md: a mean
score of 2.4 at 100k and 4.2 at 200k, a random policy's being 1.58), 9 to 18 minutes of a 2-core CPU, past the suite's
budget. What is tested of it is the update's part: it moves every Q value toward its target.
"""

import numpy as np
import pytest
import torch
from checks import ATOL, RTOL, check_bad_input_in_process, detached
from helpers import load_script, one_torch_thread, recorded_runs
from test_ppo_atari import BATCH, NUM_ACTIONS, PQN, PQN_TWIN, build, call_update, random_minibatch, random_rollout

SCRIPTS = (PQN, PQN_TWIN)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():  # the CNN's OpenMP threads wait for one another on a small shared machine
        yield


@pytest.mark.parametrize("name", SCRIPTS)
def test_updates_move_every_q_value_toward_its_target(name):
    """Four updates on one batch whose targets lie above Q(s, a) for actions 0 and 1 and below it for 2 and 3: every
    Q(s, a) moves toward its target and the loss falls. (The sign is tied to the action so that a few small steps
    can follow it for every sample, not only on average.)"""
    pqn = build(name, learning_rate=1e-3)
    batch = random_minibatch(seed=5, masked_fraction=0.0)

    def q_of_actions():
        with torch.no_grad():
            return pqn.network(batch["obs"].float()).gather(1, batch["actions"][:, None])[:, 0]

    before = q_of_actions()
    offsets = torch.where(batch["actions"] < 2, 1.0, -1.0) * (
        0.5 + torch.rand(BATCH, generator=torch.Generator().manual_seed(6))
    )
    batch["returns"] = before + offsets
    losses = [detached(call_update(pqn, name, batch)) for _ in range(4)]
    assert set(losses[0]) == {"td_loss", "q_values"}
    after = q_of_actions()
    moved = (after - before) * offsets.sign()
    assert (moved > 0).all(), f"Q values that moved away from their targets: {moved[moved <= 0]}"
    assert losses[-1]["td_loss"] < losses[0]["td_loss"]
    assert ((after - batch["returns"]) ** 2).mean() < losses[-1]["td_loss"]


# --- Q(lambda) returns and epsilon-greedy ---------------------------------------------------------------------------


def reference_q_lambda_returns(rewards, values, dones, next_value, next_done, gamma, q_lambda):
    """The lambda-return from its definition, one env and one step at a time, in float64: the (1 - lambda) lambda^(n-1)
    weighted mix of the n-step returns G(n) = r[t] + ... + gamma^(n-1) r[t+n-1] + gamma^n max_a Q(obs[t+n]), the longest
    one available (up to the episode's end, with no bootstrap there, or to the rollout's end) taking the rest of the
    weight."""
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
    """The plain loop and the twin's parallel scan (compiled and on CUDA: test_ppo_atari.py's
    test_twin_compiled_matches_eager)."""
    compute = load_script(name).compute_q_lambda_returns
    for (num_steps, num_envs, seed), q_lambda in (((128, 8, 0), 0.65), ((37, 3, 1), 0.65), ((1, 2, 2), 0.65),
                                                  ((20, 3, 3), 0.0), ((20, 3, 4), 1.0)):  # fmt: skip
        rollout = random_rollout(num_steps, num_envs, seed)
        assert 0 < rollout["dones"].sum() or num_steps == 1
        expected = reference_q_lambda_returns(**rollout, gamma=0.99, q_lambda=q_lambda)
        actual = compute(**rollout, gamma=0.99, q_lambda=q_lambda)
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m, n=num_steps: f"T={n}: {m}")
    # lambda 0: one-step Q-learning targets, cut where observation t + 1 ends an episode.
    rollout = random_rollout(16, 4, seed=5)
    next_values = torch.cat([rollout["values"][1:], rollout["next_value"][None]])
    next_non_terminal = 1 - torch.cat([rollout["dones"][1:], rollout["next_done"][None]])
    one_step = rollout["rewards"] + 0.9 * next_non_terminal * next_values
    torch.testing.assert_close(compute(**rollout, gamma=0.9, q_lambda=0.0), one_step, rtol=RTOL, atol=ATOL)


def test_epsilon_greedy_explores_at_its_rate():
    """epsilon 0: the argmax; epsilon 1: uniform actions; epsilon 0.25: a quarter of the rows random (which pick the
    greedy action a quarter of the time too)."""
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


# --- The last rollout of a run: the epsilons it acted with, its targets at truncations and lost lives ---------------

# Asterix games cut by a time limit of 100 steps, in the second of two rollouts of 4 envs x 64 steps; under a
# near-random policy (epsilon from 1 to 0.5 over the run) the first life is lost after about 65-95 steps: lives lost in
# that rollout too.
NUM_ENVS, NUM_STEPS, TOTAL = 4, 64, 512
TIME_LIMIT_RUN = ("--env-id", "Asterix-v5", "--num-envs", NUM_ENVS, "--num-steps", NUM_STEPS, "--total-timesteps",
                  TOTAL, "--num-minibatches", 2, "--update-epochs", 1, "--end-e", 0.5,
                  "--exploration-fraction", 1)  # fmt: skip


@pytest.fixture(scope="module")
def recorded_run():
    """recorded_run(name): (globals, envpool steps) of TIME_LIMIT_RUN, seed 1, with the epsilon each step acted with
    (the twin's policy reads epsilon_tensor, the plain script's epsilon); each run made once."""
    record = recorded_runs(TIME_LIMIT_RUN, lambda name: "epsilon_tensor" if name == PQN_TWIN else "epsilon")
    return lambda name: record(name, 1, max_episode_steps=100)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_loop_acts_with_epsilon_at_the_step_count_after_each_step(name, recorded_run):
    """CleanRL's order: each env step acts with the rate at the step count it brings the run to (num_envs more than
    before it), so the first step explores a little less than start-e, and the last one of the run (whose decay, from 1
    to 0.5, lasts the whole run) at end-e."""
    _, steps = recorded_run(name)
    assert len(steps) == TOTAL // NUM_ENVS
    expected = [max(0.5, 1 - 0.5 * (k + 1) * NUM_ENVS / TOTAL) for k in range(len(steps))]
    assert expected[0] == pytest.approx(1 - 0.5 * NUM_ENVS / TOTAL) and expected[-1] == 0.5
    assert [step["epsilon"] for step in steps] == pytest.approx(expected, rel=0, abs=1e-6)


@pytest.mark.parametrize("name", SCRIPTS)
def test_returns_end_at_truncations_as_terminations_and_span_no_reset(name, recorded_run):
    """A truncation (the time limit) ends the return as a termination (a lost life) does, as in CleanRL and the PQN
    paper: the last rollout's Q(lambda) targets are those of their definition, computed from what the envs returned
    (clipped rewards; an episode ends where a life is lost or the time limit cuts the game) and the script's max-Q
    values, every episode end cutting the return; at a step that ends an episode, truncated or not, the target is the
    reward alone, with nothing bootstrapped from the episode's last frame, and no target up to an end depends on what
    comes after it. The step after each end, envpool's reset step, is masked out."""
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
    # No target reaches across a reset: junk in everything after an end (the rewards from the reset step on, the max-Q
    # of the episode's last frame and of later ones, the bootstrap past the rollout) leaves every target up to that end
    # as the run computed it.
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
