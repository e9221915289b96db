"""Tests of the continuous PPO pair: leanrl/ppo_continuous_action.py (plain) and its twin (_torchcompile.py)."""

import io
import statistics

import numpy as np
import pytest
import run_utils
import torch
from checks import (
    ATOL,
    RTOL,
    SameUpdates,
    assert_changed,
    assert_leaves_close,
    assert_same_state,
    check_a_second_build_computes_with_its_own_hyperparameters,
    check_bad_input_in_process,
    flat,
    sync_,
)
from helpers import (
    DEVICES,
    expose,
    load_script,
    optimizer_steps,
    requires_cuda,
    run_in_process,
    run_in_process_until,
)
from tensordict import TensorDict

PLAIN = "ppo_continuous_action"
TWIN = "ppo_continuous_action_torchcompile"
SCRIPTS = (PLAIN, TWIN)

OBS_DIM, ACTION_DIM, MINIBATCH = 11, 3, 64


def build(module, device="cpu", seed=0, **arg_overrides):
    """An agent of either script on `device`, its networks as attributes (helpers.expose)."""
    torch.manual_seed(seed)
    args = module.Args(**arg_overrides)
    ppo = module.build_ppo(OBS_DIM, ACTION_DIM, args, torch.device(device))
    return expose(ppo, "agent", *(("acting_agent",) if hasattr(args, "compile") else ()))


def parameters(ppo):
    return {name: value.detach().clone() for name, value in ppo.agent.named_parameters()}


def random_minibatch(ppo, seed):
    """A minibatch as a rollout would give it: actions drawn near the policy's mean, their log-probabilities
    under a slightly different (older) policy, so that some probability ratios fall outside the clip range."""
    generator = torch.Generator().manual_seed(seed)
    device = next(ppo.agent.parameters()).device
    obs = torch.randn(MINIBATCH, OBS_DIM, generator=generator)
    actions = torch.randn(MINIBATCH, ACTION_DIM, generator=generator)
    with torch.no_grad():
        _, logprobs, _, values = (t.cpu() for t in ppo.agent.get_action_and_value(obs.to(device), actions.to(device)))
    return TensorDict(
        obs=obs,
        actions=actions,
        logprobs=logprobs + 0.3 * torch.randn(MINIBATCH, generator=generator),
        advantages=torch.randn(MINIBATCH, generator=generator),
        returns=torch.randn(MINIBATCH, generator=generator),
        values=values.flatten() + 0.5 * torch.randn(MINIBATCH, generator=generator),
        batch_size=[MINIBATCH],
    ).to(device)


def update(ppo, minibatch):
    """One minibatch update of either script's agent (the plain one takes the minibatch's tensors one by one)."""
    if hasattr(ppo, "acting_agent"):
        return dict(ppo.update(minibatch.clone()).items())
    keys = ("obs", "actions", "logprobs", "advantages", "returns", "values")
    return ppo.update(*(minibatch[key].clone() for key in keys))


# --- 1. Learning ----------------------------------------------------------------------------------------------

# The bar: 20 times the random policy's mean return on InvertedPendulum-v5 (5.16 over 500 episodes). With seeds 1
# and 2 the mean of the last 20 returns at this budget is 688 and 539 (plain), 673 and 737 (twin with --compile); at
# 12 rollouts the twin's seed 1 was at 177. The run stops at the episode that brings the mean of 20 to the bar.
LEARNING_FLAGS = ("--env-id", "InvertedPendulum-v5", "--seed", 1, "--total-timesteps", 16 * 2048)  # 16 rollouts
LEARNING_THRESHOLD = 20 * 5.16


@pytest.mark.parametrize(("name", "flags"), [(PLAIN, ()), (TWIN, ("--compile",))], ids=["plain", "twin-compile"])
def test_learns_inverted_pendulum(name, flags):
    reached = lambda returns: len(returns) >= 20 and statistics.mean(returns[-20:]) >= LEARNING_THRESHOLD  # noqa: E731
    returns = run_in_process_until(name, *LEARNING_FLAGS, *flags, reached=reached)
    assert reached(returns), f"no 20 consecutive returns reach {LEARNING_THRESHOLD:.1f} on average: {returns}"


# --- 2. Advantages ------------------------------------------------------------------------------------------------


def reference_advantages(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """GAE written out per env with Python floats, straight from its definition:
    A_t = delta_t + gamma * lambda * A_{t+1}, cut where the next observation starts a new episode."""
    num_steps, num_envs = rewards.shape
    advantages = torch.zeros(num_steps, num_envs, dtype=torch.float64)
    for env in range(num_envs):
        following = 0.0  # A_{t+1}
        for t in range(num_steps - 1, -1, -1):
            last = t == num_steps - 1
            next_starts_episode = float(next_done[env] if last else dones[t + 1, env])
            bootstrap = float(next_value[env] if last else values[t + 1, env])
            delta = float(rewards[t, env]) + gamma * bootstrap * (1 - next_starts_episode) - float(values[t, env])
            following = delta + gamma * gae_lambda * (1 - next_starts_episode) * following
            advantages[t, env] = following
    return advantages.float()


def random_rollout(num_steps, num_envs, seed):
    generator = torch.Generator().manual_seed(seed)
    return dict(
        rewards=torch.randn(num_steps, num_envs, generator=generator),
        values=torch.randn(num_steps, num_envs, generator=generator),
        dones=(torch.rand(num_steps, num_envs, generator=generator) < 0.15).float(),
        next_value=torch.randn(num_envs, generator=generator),
        next_done=torch.tensor([1.0] + [0.0] * (num_envs - 1)),
    )


@pytest.mark.parametrize("num_steps", [1, 2, 37, 128, 2048])
@pytest.mark.parametrize(
    ("name", "compiled"), [(PLAIN, False), (TWIN, False), (TWIN, True)], ids=["plain", "twin", "twin-compiled"]
)
@pytest.mark.parametrize("device", DEVICES)
def test_advantages_match_reference(device, name, compiled, num_steps):
    """GAE, eager and compiled, is the definition's, which cuts it at every episode end (about 15% of the steps)."""
    module = load_script(name)
    rollout = random_rollout(num_steps, 3, seed=num_steps)
    assert rollout["dones"].sum() > 0 or num_steps < 10, "no episode end in the rollout"
    compute = torch.compile(module.compute_advantages) if compiled else module.compute_advantages
    gamma, gae_lambda = 0.99, 0.95
    actual = compute(**{key: value.to(device) for key, value in rollout.items()}, gamma=gamma, gae_lambda=gae_lambda)
    expected = reference_advantages(**rollout, gamma=gamma, gae_lambda=gae_lambda)
    assert actual.shape == (num_steps, 3) and actual.device.type == device
    torch.testing.assert_close(actual.cpu(), expected, rtol=RTOL, atol=ATOL)


def test_truncation_bootstraps_and_termination_does_not():
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0])
    terminations = np.array([True, False, False, True])
    truncations = np.array([False, True, False, True])  # env 3: both flags, a termination
    final_obs = np.array([np.full(OBS_DIM, 0.5), np.full(OBS_DIM, 2.0), None, np.full(OBS_DIM, 7.0)], dtype=object)
    value = lambda obs: obs.sum(1)  # noqa: E731 (a stand-in value function)
    expected = torch.tensor([1.0, 2.0 + 0.9 * 2.0 * OBS_DIM, 3.0, 4.0])
    plain = load_script(PLAIN).bootstrap_truncated(rewards, terminations, truncations, final_obs, value, 0.9)
    torch.testing.assert_close(plain, expected)
    assert torch.equal(rewards, torch.tensor([1.0, 2.0, 3.0, 4.0])), "the plain script changed its input in place"
    # The twin's rewards stay numpy until the rollout ends; the value runs on the device it is given.
    numpy_rewards = rewards.numpy().copy()
    twin = load_script(TWIN).bootstrap_truncated(numpy_rewards, terminations, truncations, final_obs, value, 0.9, "cpu")
    assert twin.dtype == np.float32
    torch.testing.assert_close(torch.from_numpy(twin), expected)
    assert torch.equal(torch.from_numpy(numpy_rewards), rewards), "the twin changed its input in place"


# --- 3. Updates: compiled vs eager twin, captured vs not, twin vs plain ----------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_twin_eager_and_compiled_updates_and_policy_match_plain(device, inductor_fallback_random):
    """Same start, same minibatches, same learning rate schedule: the twin's update, eager and compiled, computes the
    plain one; the twin samples as the plain script does (seeded alike) and acts with the updated parameters (through
    its acting copy of the agent, outside autograd)."""
    module = load_script(TWIN)
    plain = build(load_script(PLAIN), device)
    twins = build(module, device), build(module, device, compile=True)
    for twin in twins:
        sync_(twin.agent, plain.agent)
    obs = torch.randn(1, OBS_DIM, generator=torch.Generator().manual_seed(7)).to(device)
    outputs = []
    for ppo in (plain, *twins):
        torch.manual_seed(42)
        outputs.append([tensor.clone() for _ in range(2) for tensor in ppo.policy(obs)])  # 2 x (action, logp, value)
    action, logprob, value = outputs[0][:3]
    assert action.shape == (1, ACTION_DIM) and logprob.shape == (1,) and value.shape == (1,)
    assert not torch.equal(outputs[0][0], outputs[0][3]), "the policy does not sample"
    for twin_outputs in outputs[1:]:
        for actual, expected in zip(twin_outputs, outputs[0], strict=True):
            torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)

    start, checks = parameters(plain), [SameUpdates("update") for _ in twins]
    for round_ in range(3):  # the learning rate annealed (a tensor written in place in the twin), Adam's state grows
        minibatch, lr, losses = random_minibatch(plain, seed=round_), 3e-4 * (1 - round_ / 3), []
        for ppo in (plain, *twins):
            ppo.set_learning_rate(lr)
            losses.append(update(ppo, minibatch))
        assert {"pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac"} <= losses[0].keys()
        for twin, twin_losses, check in zip(twins, losses[1:], checks, strict=True):
            assert_leaves_close(twin_losses, losses[0], f"round {round_} losses")
            check.check(twin.agent, plain.agent, lr, f"round {round_}")
    assert_changed(start, parameters(plain), "the plain agent's parameters")
    assert 0 < losses[0]["clipfrac"] < 1, "the minibatch does not exercise the clipping"
    for twin in twins:
        torch.testing.assert_close(twin.value(obs), plain.value(obs), rtol=RTOL, atol=ATOL)
        assert all(tensor.grad_fn is None for tensor in (twin.value(obs), *twin.policy(obs)))


@requires_cuda
def test_twin_captured_update_policy_and_gae_match_uncaptured(inductor_fallback_random):
    """CudaGraphModule(warmup=5): calls 1-4 run eagerly on a side stream, call 5 runs once and records the graph,
    calls 6-8 replay it. Each call is compared with the uncaptured compiled twin's. The learning rate is a tensor
    written in place between calls (annealing); before call 7 other parameters are written in place, and the
    learning rate set to 0: the replays follow both (the parameters do not move)."""
    module = load_script(TWIN)
    uncaptured = build(module, "cuda", compile=True)
    captured = build(module, "cuda", compile=True, cudagraphs=True)
    assert_leaves_close(parameters(captured), parameters(uncaptured), "initial parameters", rtol=0, atol=0)
    check = SameUpdates("update")
    for call in range(1, 9):
        lr = 0.0 if call == 7 else 3e-4 * (1 - call / 10)
        if call == 7:
            others = build(module, "cuda", seed=1)
            for ppo in (uncaptured, captured):
                sync_(ppo.agent, others.agent)
        for ppo in (uncaptured, captured):
            ppo.set_learning_rate(lr)
        minibatch = random_minibatch(uncaptured, seed=call)
        losses = {
            label: dict(ppo.update(minibatch.clone()).items())
            for label, ppo in (("uncaptured", uncaptured), ("captured", captured))
        }
        assert_leaves_close(losses["captured"], losses["uncaptured"], f"call {call} losses")
        if call == 7:
            assert_leaves_close(parameters(captured), parameters(others), "parameters after a step of lr 0", 0, 0)
        check.check(captured.agent, uncaptured.agent, lr, f"call {call}", grads=call != 5)  # 5: recorded

        obs = torch.randn(4, OBS_DIM, generator=torch.Generator().manual_seed(call)).to("cuda")
        outputs = {}
        for label, ppo in (("uncaptured", uncaptured), ("captured", captured)):
            torch.manual_seed(100 * call)
            outputs[label] = ppo.policy(obs)
        for index, (actual, expected) in enumerate(zip(outputs["captured"], outputs["uncaptured"], strict=True)):
            torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m, i=index: f"{i}: {m}")

        rollout = random_rollout(64, 2, seed=call)
        expected = reference_advantages(**rollout, gamma=0.99, gae_lambda=0.95)  # the Args defaults
        rollout = {key: value.to("cuda") for key, value in rollout.items()}
        advantages = {label: ppo.gae(**rollout) for label, ppo in (("uncaptured", uncaptured), ("captured", captured))}
        torch.testing.assert_close(advantages["captured"], advantages["uncaptured"], rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(advantages["captured"].cpu(), expected, rtol=RTOL, atol=ATOL)
    assert captured.update.counter == captured.policy.counter == 5, "the update and the policy were not captured"
    assert captured.gae.counter == 5, "the advantages were not captured"


@requires_cuda
def test_twin_captured_policy_samples_anew_at_each_replay():
    """The twin as a run with --compile --cudagraphs uses it (inductor's own random numbers): after the capture,
    two replays on one observation sample other actions; seeded alike, they sample the same."""
    ppo = build(load_script(TWIN), "cuda", compile=True, cudagraphs=True)
    obs = torch.randn(1, OBS_DIM, generator=torch.Generator().manual_seed(7)).to("cuda")
    for _ in range(6):  # the 5th call records the graph, the 6th replays it
        ppo.policy(obs)
    assert ppo.policy.counter == 5
    first, second = ppo.policy(obs)[0], ppo.policy(obs)[0]
    assert not torch.equal(first, second), "two replays of the policy drew the same actions"
    replays = []
    for _ in range(2):
        torch.manual_seed(3)
        replays.append(ppo.policy(obs)[0])
    torch.testing.assert_close(replays[1], replays[0], rtol=0, atol=0)


def test_twin_built_again_computes_with_its_own_hyperparameters(inductor_fallback_random):
    def compiled_calls(module, **overrides):
        ppo = build(module, **overrides)
        obs = torch.randn(1, OBS_DIM, generator=torch.Generator().manual_seed(7))
        torch.manual_seed(8)
        outputs = flat(policy=ppo.policy(obs), value=ppo.value(obs), gae=ppo.gae(**random_rollout(32, 4, seed=9)))
        outputs.update(flat(losses=ppo.update(random_minibatch(ppo, seed=77)), agent=parameters(ppo)))
        return outputs

    check_a_second_build_computes_with_its_own_hyperparameters(TWIN, compiled_calls)


# --- 4. Bad input -------------------------------------------------------------------------------------------------

BAD_INPUTS = {  # a flag outside its domain: test_run_rules.py; an unknown env: test_scripts.py
    "discrete-env": (("--env-id", "CartPole-v1"), ("CartPole-v1",)),
    "minibatches-not-dividing": (("--num-steps", "100", "--num-minibatches", "8"), ("num-minibatches", "100")),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
@pytest.mark.parametrize("name", SCRIPTS)
def test_bad_input_exits_2_with_one_clear_line(name, case, tmp_path, capsys):
    check_bad_input_in_process(name, *BAD_INPUTS[case], tmp_path, capsys)


# --- 5. Checkpoints: resuming, the agent's state across the pair, the evaluation, the normalisation ----------------


def learning_rate(checkpoint):
    return checkpoint["agent"]["optimizer"]["param_groups"][0]["lr"]


def counts(checkpoint, key):
    """Each env's count of its normalisation statistics of the observations or rewards (key "obs" or "reward")."""
    return [state[key]["count"] for state in checkpoint["normalization"]]


@pytest.mark.parametrize("name", SCRIPTS)
def test_resume_continues_the_run_its_lr_schedule_and_normalisation(name, tmp_path, saved_checkpoints):
    """A run of 4 iterations of 2 envs x 32 steps checkpointed after each, and a run resumed after the 2nd: it ends
    with the uninterrupted run's step counts, anneals the learning rate as that run did (not as a shorter run's), and
    each env's normalisation statistics go on from the checkpoint's."""
    flags = ("--env-id", "InvertedPendulum-v5", "--num-envs", 2, "--num-steps", 32, "--num-minibatches", 2,
             "--update-epochs", 2, "--total-timesteps", 256, "--checkpoint-every", 64, "--save-model",
             "--eval-episodes", 0)  # fmt: skip
    run_in_process(name, *flags, "--model-path", tmp_path / "full.pt")
    full = saved_checkpoints[:]
    assert [checkpoint["iteration"] for checkpoint in full] == [1, 2, 3, 4]
    assert [learning_rate(checkpoint) for checkpoint in full] == pytest.approx([3e-4, 2.25e-4, 1.5e-4, 0.75e-4])
    torch.save(full[1], tmp_path / "mid.pt")
    saved_before = len(saved_checkpoints)  # the mid.pt just saved included
    resumed_run = run_in_process(name, *flags, "--resume", tmp_path / "mid.pt", "--model-path", tmp_path / "resumed.pt")
    resumed = saved_checkpoints[saved_before:]
    assert [(c["iteration"], c["global_step"]) for c in resumed] == [(3, 192), (4, 256)]
    assert optimizer_steps(resumed[-1]) == optimizer_steps(full[-1])
    assert [learning_rate(c) for c in resumed] == [learning_rate(c) for c in full[2:]], "the schedule restarted"

    # The reward statistics count one value a step, whatever the episodes: as many as the uninterrupted run's.
    assert counts(resumed[-1], "reward") == pytest.approx(counts(full[-1], "reward"))
    assert counts(full[-1], "reward") == pytest.approx([128, 128], abs=1e-3)
    # The observation statistics count every observation, a reset's too: the checkpoint's, then the resumed run's
    # first reset of each env, its 2 x 64 steps and the reset after each of its episodes.
    episodes = len(resumed_run["episode_returns"])
    assert episodes > 0
    expected = sum(counts(full[1], "obs")) + 2 + 128 + episodes
    assert sum(counts(resumed[-1], "obs")) == pytest.approx(expected, abs=1e-6)
    assert not torch.equal(resumed[-1]["normalization"][0]["obs"]["mean"], full[1]["normalization"][0]["obs"]["mean"])


def test_state_dicts_load_across_the_pair():
    """Each script's agent state loads into the other's (the twin's fused Adam and lr tensor included): the same
    state_dict comes back, acting sees the loaded parameters, and the next update is the same on both sides."""
    obs = torch.randn(5, OBS_DIM, generator=torch.Generator().manual_seed(3))
    for source_name, target_name in ((PLAIN, TWIN), (TWIN, PLAIN)):
        source, target = build(load_script(source_name), seed=0), build(load_script(target_name), seed=1)
        source.set_learning_rate(1.7e-4)  # a float that float32 does not hold exactly
        for seed in range(2):  # Adam's moments and step count are in the state
            update(source, random_minibatch(source, seed=seed))
        saved = io.BytesIO()  # through torch.save and back, as a checkpoint goes: nothing shared with the source
        torch.save(source.state_dict(), saved)
        saved.seek(0)
        target.load_state_dict(torch.load(saved, weights_only=True))
        what = f"{target_name} from {source_name}"
        assert_same_state(target.state_dict(), source.state_dict(), what)
        torch.testing.assert_close(target.value(obs), source.value(obs), rtol=0, atol=0, msg=what)
        check = SameUpdates("update")
        minibatch = random_minibatch(source, seed=2)
        for ppo in (source, target):
            update(ppo, minibatch)
        check.check(target.agent, source.agent, 1.7e-4, what)


def test_evaluation_normalises_with_the_checkpoints_statistics_frozen():
    """The evaluation normalises the observations with the checkpoint's statistics, and does not update them."""
    module = load_script(PLAIN)
    torch.manual_seed(0)
    agent = module.Agent(4, 1).state_dict()  # InvertedPendulum-v5: 4 observations, 1 action
    agent["actor_mean.4.weight"] *= 300  # the mean action follows the (normalised) observation closely
    agent["actor_logstd"][:] = -10  # and the sampled action is its mean
    args = module.Args(env_id="InvertedPendulum-v5", eval_episodes=3)

    def eval_return(obs_mean, obs_count):
        f64 = torch.float64
        obs = {"mean": torch.full((4,), obs_mean, dtype=f64), "var": torch.ones(4, dtype=f64), "count": obs_count}
        reward = {"mean": torch.tensor(0.0, dtype=f64), "var": torch.tensor(1.0, dtype=f64), "count": 1.0}
        checkpoint = {"agent": {"agent": agent}, "normalization": [{"obs": obs, "reward": reward}]}
        env = module.make_env(args.env_id, args.gamma)()
        act = module.evaluation_policy(checkpoint, env, torch.device("cpu"))
        return run_utils.evaluate(env, act, args.eval_episodes, args.seed + run_utils.EVAL_SEED_OFFSET, None, [])

    assert eval_return(0.0, 1.0) != eval_return(0.5, 1.0), "the checkpoint's statistics are not used"
    # Statistics of one observation, if updated, would move at once; those of 10**9 would not.
    assert eval_return(0.0, 1.0) == eval_return(0.0, 1e9), "the statistics change during the evaluation"


def test_twin_envs_normalise_as_the_plain_scripts():
    """The twin's normalisation wrappers update their running moments from one sample without np.mean and np.var:
    the plain script's observations, rewards and statistics, bit for bit, step by step and across episode ends."""
    modules = [load_script(name) for name in (PLAIN, TWIN)]
    envs = [module.make_env("InvertedPendulum-v5", 0.99)() for module in modules]
    actions = np.random.default_rng(0).uniform(-3, 3, (600, 1))  # random actions: episodes of a few steps
    records = [[], []]  # each env's (observation, reward, terminated) after each step, and each reset's observation
    for env, record in zip(envs, records, strict=True):
        record.append((env.reset(seed=1)[0],))
        for action in actions:
            obs, reward, terminated, truncated, _ = env.step(action)
            record.append((obs, reward, terminated))
            if terminated or truncated:
                record.append((env.reset()[0],))
    assert len(records[0]) > len(actions) + 10, "fewer than 10 episode ends"
    for entry, (plain, twin) in enumerate(zip(*records, strict=True)):
        assert all(np.array_equal(a, b) for a, b in zip(plain, twin, strict=True)), f"entry {entry}: {plain}, {twin}"
    plain_state, twin_state = (module.normalization_state(env) for module, env in zip(modules, envs, strict=True))
    # Every observation, resets' included, updates the observations' statistics; every step the rewards'.
    for key, samples in (("obs", len(records[0])), ("reward", len(actions))):
        assert plain_state[key]["count"] == twin_state[key]["count"] == pytest.approx(1e-4 + samples)
        assert all(torch.equal(plain_state[key][moment], twin_state[key][moment]) for moment in ("mean", "var")), key


# Flags, --help, determinism, the results line, flag combinations, checkpoints across the pair, refused checkpoints,
# video and signals: test_scripts.py.
