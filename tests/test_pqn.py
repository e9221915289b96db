"""Tests of the PQN pair for classic control: leanrl/pqn.py (plain) and its twin pqn_torchcompile.py."""

import statistics
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from checks import (
    ATOL,
    RTOL,
    SameUpdates,
    assert_changed,
    assert_leaves_close,
    check_a_second_build_computes_with_its_own_hyperparameters,
    check_bad_input_in_process,
    check_resume_continues_the_run,
    flat,
    leaves,
    sync_,
)
from helpers import (
    DEVICES,
    expose,
    load_script,
    one_torch_thread,
    requires_cuda,
    run_in_process,
    run_in_process_until,
)
from tensordict import TensorDict

PLAIN = "pqn"
TWIN = "pqn_torchcompile"
SCRIPTS = (PLAIN, TWIN)

OBS_DIM, N_ACTIONS, BATCH = 4, 3, 64  # three actions: a wrong gather or argmax axis shows up
# A tiny rollout: 2 envs x 16 steps, 2 minibatches, 1 epoch (32 env steps per iteration).
TINY_FLAGS = ("--env-id", "CartPole-v1", "--num-envs", 2, "--num-steps", 16, "--num-minibatches", 2,
              "--update-epochs", 1)  # fmt: skip


def build(module, device="cpu", seed=0, **arg_overrides):
    """An agent of either script on `device`; its Args as `.args`."""
    torch.manual_seed(seed)
    args = module.Args(**arg_overrides)
    pqn = module.build_pqn(OBS_DIM, N_ACTIONS, args, torch.device(device))
    pqn.args = args
    return expose(pqn, "qnet")


def minibatch(seed, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    return TensorDict(
        obs=torch.randn(BATCH, OBS_DIM, generator=generator),
        actions=torch.randint(N_ACTIONS, (BATCH,), generator=generator),
        returns=torch.randn(BATCH, generator=generator) * 5,
        batch_size=[BATCH],
    ).to(device)


def random_rollout(seed, num_steps=16, num_envs=3, device="cpu"):
    """rewards, values, dones ([num_steps, num_envs]; an episode end about every 6 steps) and last_value."""
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(num_steps, num_envs, generator=generator)
    values = torch.randn(num_steps, num_envs, generator=generator) * 3
    dones = (torch.rand(num_steps, num_envs, generator=generator) < 0.15).float()
    last_value = torch.randn(num_envs, generator=generator) * 3
    return [tensor.to(device) for tensor in (rewards, values, dones, last_value)]


def reference_q_lambda_returns(rewards, values, dones, last_value, gamma, q_lambda):
    """Q(lambda) targets from their definition (the forward view), in float64: the lambda-weighted mean of a step's
    n-step returns, G(n) = r[t] + ... + gamma^(n-1) r[t+n-1] + gamma^n max-Q(obs t+n), where max-Q(obs t+n) is
    values[t+n] (last_value past the rollout); the longest, to the rollout's end, takes the remaining weight. An
    n-step return that reaches the end of the episode stops there, with no bootstrap."""
    rewards, values, dones, last_value = (x.double().cpu() for x in (rewards, values, dones, last_value))
    num_steps, num_envs = rewards.shape
    bootstrap = torch.cat([values, last_value[None]])
    returns = torch.zeros(num_steps, num_envs, dtype=torch.float64)
    for env in range(num_envs):
        for t in range(num_steps):
            n_step_returns, discounted, ended = [], 0.0, False
            for n in range(1, num_steps - t + 1):
                if not ended:
                    discounted += gamma ** (n - 1) * rewards[t + n - 1, env]
                    ended = bool(dones[t + n - 1, env])
                n_step_returns.append(discounted if ended else discounted + gamma**n * bootstrap[t + n, env])
            longest = n_step_returns.pop()
            weights = [(1 - q_lambda) * q_lambda ** (n - 1) for n in range(1, len(n_step_returns) + 1)]
            mixed = sum(w * g for w, g in zip(weights, n_step_returns, strict=True))
            returns[t, env] = mixed + q_lambda ** len(n_step_returns) * longest
    return returns


# --- 1. Learning ----------------------------------------------------------------------------------------------

# The twin with --compile on CartPole-v1: the mean of 20 consecutive returns must reach LEARNING_THRESHOLD (the run
# stops there). Seed 1 reaches it after 29,809 steps (2-core AMD EPYC VM, 1 thread), seeds 2 to 5 after 33,938,
# 42,690, 23,931 and 35,022. The budget sets the decay's length: seed 1 made 394.3 at most in a budget of 40,000.
LEARNING_FLAGS = ("--env-id", "CartPole-v1", "--num-envs", 8, "--num-steps", 32, "--learning-rate", 2e-3,
                  "--q-lambda", 0.9, "--exploration-fraction", 0.1, "--seed", 1, "--compile")  # fmt: skip
LEARNING_STEPS = 60000
LEARNING_THRESHOLD = 400.0  # a random policy: about 22; the maximum: 500


def test_learns_cartpole_twin_compiled():
    reached = lambda returns: len(returns) >= 20 and statistics.mean(returns[-20:]) >= LEARNING_THRESHOLD  # noqa: E731
    with one_torch_thread():  # the thread count changes float sums, so greedy actions, so the run
        returns = run_in_process_until(TWIN, *LEARNING_FLAGS, "--total-timesteps", LEARNING_STEPS, reached=reached)
    assert reached(returns), f"no 20 consecutive returns reach {LEARNING_THRESHOLD} on average: {returns}"


# --- 2. Q(lambda) targets, the update and the policy: the twin's with the plain, compiled with eager -------------


@pytest.mark.parametrize("q_lambda", [0.0, 0.65, 1.0])
@pytest.mark.parametrize("name", SCRIPTS)
def test_q_lambda_returns_match_their_definition(name, q_lambda):
    module = load_script(name)
    rollout = random_rollout(11)
    assert rollout[2].sum() >= 4, "the test needs episode ends"
    returns = module.q_lambda_returns(*rollout, 0.99, q_lambda)
    expected = reference_q_lambda_returns(*rollout, 0.99, q_lambda)
    torch.testing.assert_close(returns.double(), expected, rtol=1e-5, atol=1e-5)


def update(pqn, batch):
    """One minibatch update of either script's agent: the plain update takes tensors, the twin's a TensorDict."""
    if hasattr(pqn.args, "compile"):
        return TensorDict(pqn.update(batch))
    return TensorDict(pqn.update(batch["obs"], batch["actions"], batch["returns"]))


@pytest.mark.parametrize("device", DEVICES)
def test_twin_eager_and_compiled_update_policy_and_returns_match_plain(device, inductor_fallback_random):
    """Same start, same minibatches: the twin's update, eager and compiled, is the plain script's, and so are its
    greedy actions, values (max_a Q) and Q(lambda) targets; compiled it explores as eager (seeded alike). Each takes a
    random action at rate epsilon (the pair's draws differ by design: the twin draws one tensor for both choices)."""
    module = load_script(TWIN)
    plain = build(load_script(PLAIN), device)
    twins = build(module, device), build(module, device, compile=True)
    for twin in twins:
        sync_(twin.qnet, plain.qnet)
    start, checks = leaves(TensorDict.from_module(plain.qnet)), [SameUpdates("Q update") for _ in twins]
    # Several rounds, the learning rate annealed (the twin's lives in a tensor): RAdam's rectification starts late.
    for round_, lr in enumerate(np.linspace(2.5e-4, 1e-4, 8)):
        batch, losses = minibatch(100 + round_, device), []
        for pqn in (plain, *twins):
            pqn.set_learning_rate(float(lr))
            losses.append(leaves(update(pqn, batch.clone())))
        assert losses[0].keys() == {"td_loss", "q_values"}
        for twin, twin_losses, check in zip(twins, losses[1:], checks, strict=True):
            assert_leaves_close(twin_losses, losses[0], f"round {round_} losses")
            check.check(twin.qnet, plain.qnet, float(lr), f"round {round_}")
    assert_changed(start, leaves(TensorDict.from_module(plain.qnet)), "the Q network")
    obs = torch.randn(20000, OBS_DIM, generator=torch.Generator().manual_seed(9)).to(device)
    with torch.no_grad():
        max_q, greedy = plain.qnet(obs).max(1)
    assert len(greedy.unique()) > 1
    for twin in twins:
        torch.testing.assert_close(twin.value(obs), plain.value(obs), rtol=RTOL, atol=ATOL)
    for seed, epsilon in enumerate((0.0, 0.3, 1.0)):
        results = []
        for pqn in (plain, *twins):
            torch.manual_seed(seed)  # the exploration draws, alike on each side
            results.append(pqn.policy(obs, epsilon if pqn is plain else torch.tensor(epsilon, device=device)))
        assert torch.equal(results[2][0], results[1][0]), f"compiled and eager twins, epsilon {epsilon}"
        for actions, values in results:
            assert actions.dtype == torch.int64 and (epsilon > 0 or torch.equal(actions, greedy))
            torch.testing.assert_close(values, max_q, rtol=RTOL, atol=ATOL)
            not_greedy = (actions != greedy).float().mean().item()
            assert not_greedy == pytest.approx(epsilon * (N_ACTIONS - 1) / N_ACTIONS, abs=0.015), epsilon
    for actions, _ in results:  # epsilon 1
        counts = torch.bincount(actions, minlength=N_ACTIONS).float() / len(obs)
        torch.testing.assert_close(counts.cpu(), torch.full((N_ACTIONS,), 1 / N_ACTIONS), rtol=0, atol=0.02)
    for seed in range(3):
        rollout = random_rollout(seed, num_steps=128, num_envs=4, device=device)
        for twin in twins:
            torch.testing.assert_close(twin.returns(*rollout), plain.returns(*rollout), rtol=1e-5, atol=1e-5)


@requires_cuda
def test_twin_captured_update_policy_and_returns_match_uncaptured(inductor_fallback_random):
    """CudaGraphModule(warmup=5): calls 1-4 run on a side stream, call 5 records the graph, later calls replay it;
    each is compared with the uncaptured compiled twin's (the recording call's gradients cannot be read)."""
    module = load_script(TWIN)
    uncaptured = build(module, "cuda", compile=True)
    captured = build(module, "cuda", compile=True, cudagraphs=True)
    warmup = 5  # the twin's CudaGraphModule(warmup=5)
    sync_(captured.qnet, uncaptured.qnet)
    check = SameUpdates("Q update")
    for call in range(1, warmup + 4):
        batch = minibatch(call, "cuda")
        losses = {label: leaves(pqn.update(batch.clone())) for label, pqn in (("u", uncaptured), ("c", captured))}
        assert_leaves_close(losses["c"], losses["u"], f"call {call} losses")
        check.check(captured.qnet, uncaptured.qnet, 2.5e-4, f"call {call}", grads=call != warmup)
        obs = torch.randn(4, OBS_DIM, generator=torch.Generator().manual_seed(call)).to("cuda")
        actions = {}
        for label, pqn in (("u", uncaptured), ("c", captured)):
            torch.manual_seed(100 * call)
            actions[label] = pqn.policy(obs, torch.tensor(0.5, device="cuda"))[0]
        assert torch.equal(actions["c"], actions["u"]), f"call {call}"
        rollout = random_rollout(call, num_steps=128, num_envs=4, device="cuda")
        torch.testing.assert_close(captured.returns(*rollout), uncaptured.returns(*rollout), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(captured.value(obs), uncaptured.value(obs))
    for function in ("update", "policy", "returns", "value"):
        assert getattr(captured, function).counter == warmup, f"{function} was not captured"


def test_twin_built_again_computes_with_its_own_hyperparameters(inductor_fallback_random):
    def compiled_calls(module, **overrides):
        pqn = build(module, **overrides)
        obs = torch.randn(4, OBS_DIM, generator=torch.Generator().manual_seed(7))
        torch.manual_seed(8)
        outputs = flat(policy=pqn.policy(obs, torch.tensor(0.5)), value=pqn.value(obs))
        outputs.update(flat(returns=pqn.returns(*random_rollout(9, num_steps=32, num_envs=4))))
        outputs.update(flat(losses=update(pqn, minibatch(77)), qnet=leaves(TensorDict.from_module(pqn.qnet))))
        return outputs

    check_a_second_build_computes_with_its_own_hyperparameters(TWIN, compiled_calls)


# --- 3. Episode ends: a truncation ends the return like a termination, no transition spans a reset ---------


@pytest.mark.parametrize("name", SCRIPTS)
def test_returns_end_at_truncations_as_terminations_and_span_no_reset(name, registered_counting_and_image_envs):
    """A rollout of 40 steps of one env, learning rate 1e-30 (the Q network that acted is the one left): rewards 1,
    nothing added at a truncation; dones at every episode end; no step spans a reset; and the Q(lambda) targets those
    of their definition, every end cutting the return (at a truncation as at a termination: the reward alone)."""
    flags = ("--env-id", "LeanrlTestCounting-v0", "--total-timesteps", 40, "--num-envs", 1, "--num-steps", 40,
             "--num-minibatches", 1, "--learning-rate", 1e-30)  # fmt: skip
    run = run_in_process(name, *flags)
    assert run["episode_returns"] == [5.0, 3.0] * 5
    keys = ("obs", "rewards", "dones", "values", "returns")
    rollout = run["rollout"] if name == TWIN else {key: run[key] for key in keys}
    obs, rewards, dones, values, returns = (rollout[key][:, 0] for key in keys)
    episode, t = obs[:, 0], obs[:, 1]
    truncated, terminated = (episode % 2 == 0) & (t == 4), (episode % 2 == 1) & (t == 2)
    assert truncated.any() and terminated.any()
    assert torch.equal(dones.bool(), truncated | terminated)
    assert torch.equal(episode[1:] == episode[:-1], ~dones[:-1].bool()), "a step spans a reset"
    torch.testing.assert_close(rewards, torch.ones(40))
    with torch.no_grad():
        torch.testing.assert_close(run["pqn"].value(obs), values, msg="the update moved the Q network")
        last_value = run["pqn"].value(run["next_obs"])[0]
        last_obs_values = run["pqn"].value(torch.stack([episode, t + 1], dim=1)[truncated])
    assert (last_obs_values.abs() > 1e-3).all(), "a bootstrap of about 0 would go unseen"
    torch.testing.assert_close(returns[truncated | terminated], torch.ones(int((truncated | terminated).sum())))
    # The definition stops each n-step return at the episode's end: no target reaches across a reset.
    q_lambda = load_script(name).Args.q_lambda
    expected = reference_q_lambda_returns(rewards[:, None], values[:, None], dones[:, None], last_value[None], 0.99,
                                          q_lambda)[:, 0]  # fmt: skip
    torch.testing.assert_close(returns.double(), expected, rtol=1e-5, atol=1e-5)


# --- 4. Bad input (a flag outside its domain: test_run_rules.py) -------------------------------------------------

BAD_INPUTS = {
    "unknown-env": (("--env-id", "NoSuchEnv-v0"), ("NoSuchEnv",)),
    "continuous-actions": (("--env-id", "Pendulum-v1"), ("Pendulum-v1", "discrete")),
    "image-observations": (("--env-id", "LeanrlTestImageObs-v0"), ("LeanrlTestImageObs-v0", "flat", "84, 84, 3")),
    "minibatches-not-dividing": (("--num-minibatches", "3"), ("num-minibatches (3)", "512")),
    "end-e-above-start-e": (("--start-e", "0.1", "--end-e", "0.5"), ("end-e (0.5)", "above", "start-e (0.1)")),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
@pytest.mark.parametrize("name", SCRIPTS)
def test_bad_input_exits_2_with_one_clear_line(name, case, tmp_path, capsys, registered_counting_and_image_envs):
    check_bad_input_in_process(name, *BAD_INPUTS[case], tmp_path, capsys)


# --- 5. Resuming (determinism, checkpoints across the pair, refused ones and signals: test_scripts.py) -------------


def record_epsilons(monkeypatch, name):
    """The exploration rate the training loop hands its policy at each env step of the runs in this process, in order:
    the loop's global (the twin's epsilon_tensor, the plain script's epsilon) in the frame that calls envs.step."""
    epsilons, env_step = [], gym.vector.SyncVectorEnv.step
    key = "epsilon_tensor" if name == TWIN else "epsilon"

    def recording_step(self, actions):
        epsilons.append(float(sys._getframe(1).f_globals[key]))
        return env_step(self, actions)

    monkeypatch.setattr(gym.vector.SyncVectorEnv, "step", recording_step)
    return epsilons


@pytest.mark.parametrize("name", SCRIPTS)
def test_resume_continues_the_run_and_its_epsilon_schedule(name, tmp_path, saved_checkpoints, monkeypatch):
    """The loop acts, in CleanRL's order, with the rate at the step count each env step brings the run to: falling in
    a straight line from start-e to end-e at exploration_fraction of the budget, then staying there. A run resumed half
    way acts with the uninterrupted run's rates (not a shorter run's: the decay is a fraction of the budget)."""
    epsilons = record_epsilons(monkeypatch, name)
    flags = (*TINY_FLAGS, "--start-e", 0.9, "--end-e", 0.1, "--exploration-fraction", 0.75)
    resumed = check_resume_continues_the_run(name, flags, tmp_path, saved_checkpoints, steps=320,
                                             same_as_shorter_run=False)  # fmt: skip
    assert resumed["iteration"] == 20
    uninterrupted, resumed_half = epsilons[:320], epsilons[320:]  # 640 then 320 steps of 2 envs
    expected = [max(0.1, 0.9 - 0.8 * (k + 1) * 2 / (0.75 * 640)) for k in range(320)]
    assert expected[0] == pytest.approx(0.9 - 0.8 / 240) and expected[-1] == 0.1
    assert uninterrupted == pytest.approx(expected, rel=0, abs=1e-6)
    assert len(resumed_half) == 160 and resumed_half == uninterrupted[160:]
    assert len(set(resumed_half)) > 10, "epsilon does not fall after the checkpoint: the check proves little"


def test_resume_with_another_budget_is_refused_without_the_anneal(tmp_path, capsys):
    """--no-anneal-lr: the epsilon decay alone is computed from the budget (with the anneal: test_run_rules.py)."""
    flags = (*TINY_FLAGS, "--no-anneal-lr")
    run_in_process(PLAIN, *flags, "--total-timesteps", 64, "--save-model", "--model-path", tmp_path / "agent.pt",
                   "--eval-episodes", 0)  # fmt: skip
    capsys.readouterr()  # what the run that saved the checkpoint printed
    check_bad_input_in_process(PLAIN, (*flags, "--total-timesteps", 128, "--resume", tmp_path / "agent.pt"),
                               ["--total-timesteps 64", "from which the epsilon decay"], tmp_path, capsys)  # fmt: skip
