"""Tests of the PPO Atari pair: leanrl/ppo_atari_envpool.py (plain) and its twin ppo_atari_envpool_torchcompile.py.

Everything goes through the scripts' stable interface: Args, compute_advantages, build_ppo and the namespace it
returns, the command line, the globals of a run (`episode_returns`, the last rollout), the --results-path JSON line,
and exit statuses. The plain script stores frames as float32, the twin as uint8: both divide by 255 in the network.
"""

import copy

import envpool
import numpy as np
import pytest
import torch
from checks import (
    ATOL,
    RTOL,
    SameUpdates,
    assert_changed,
    assert_leaves_close,
    assert_params_close_after_steps,
    assert_same_state,
    check_a_second_build_computes_with_its_own_hyperparameters,
    check_bad_input_in_process,
    check_bf16_update_is_fp32_within_rounding,
    check_resume_continues_the_run,
    detached,
    flat,
    sync_,
)
from helpers import (
    DEVICES,
    RecordingEnvs,
    built,
    episode_sums,
    expose,
    load_checkpoint,
    load_script,
    one_torch_thread,
    read_results,
    recorded_runs,
    requires_cuda,
    run_in_process,
)
from tensordict import TensorDict

PLAIN = "ppo_atari_envpool"
TWIN = "ppo_atari_envpool_torchcompile"
SCRIPTS = (PLAIN, TWIN)

NUM_ACTIONS, BATCH = 4, 64
LOSS_NAMES = {"pg_loss", "v_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac"}


# The CNN's OpenMP threads wait for one another: on a small machine shared with other jobs, two threads can run
# several times slower than one. The tests pin one thread, in this process and in the runs they start.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def build(module, device="cpu", seed=0, **arg_overrides):
    """An agent of either script on `device`, its networks as attributes (helpers.expose)."""
    torch.manual_seed(seed)
    args = module.Args(**arg_overrides)
    ppo = module.build_ppo(NUM_ACTIONS, args, torch.device(device))
    return expose(ppo, "agent", *(("acting_agent",) if hasattr(args, "compile") else ()))


def params(ppo):
    return {name: value.detach().clone() for name, value in built(ppo, "agent").state_dict().items()}


def frames_for(name, obs):
    """The frames as the script's update gets them: floats (float32, or the default dtype) in the plain script, uint8
    in channels-last order in the twin."""
    return obs.to(torch.get_default_dtype()) if name == PLAIN else obs.contiguous(memory_format=torch.channels_last)


def random_minibatch(seed, size=BATCH, masked_fraction=0.25, device="cpu"):
    """A PPO minibatch of random Atari frames (uint8) and random rollout quantities, some steps masked out."""
    generator = torch.Generator().manual_seed(seed)
    batch = dict(
        obs=torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8, generator=generator),
        actions=torch.randint(0, NUM_ACTIONS, (size,), generator=generator),
        logprobs=torch.log(torch.full((size,), 1.0 / NUM_ACTIONS)) + 0.1 * torch.randn(size, generator=generator),
        advantages=torch.randn(size, generator=generator),
        returns=torch.randn(size, generator=generator),
        values=torch.randn(size, generator=generator),
        mask=(torch.rand(size, generator=generator) >= masked_fraction).float(),
    )
    return {key: value.to(device) for key, value in batch.items()}


def call_update(ppo, name, batch):
    """The plain script's update takes the minibatch's tensors, the twin's a TensorDict of them."""
    keys = ("obs", "actions", "logprobs", "advantages", "returns", "values", "mask")
    if name == PLAIN:
        return ppo.update(frames_for(name, batch["obs"]), *(batch[key] for key in keys[1:]))
    minibatch = {key: frames_for(name, batch[key]) if key == "obs" else batch[key] for key in keys}
    return ppo.update(TensorDict(minibatch, batch_size=[len(batch["obs"])]))


# --- 1. Learning, unit level: the update moves the policy the way the advantages say ------------------------------


@pytest.mark.parametrize(
    ("name", "overrides"), [(PLAIN, {}), (TWIN, {}), (TWIN, {"compile": True})], ids=["plain", "twin", "twin-compile"]
)
def test_update_raises_probability_of_positive_advantage_actions(name, overrides):
    """Four updates on one on-policy batch: actions with A > 0 become more likely, those with A < 0 less likely.

    The sign of an advantage is tied to the action (0 and 1 good, 2 and 3 bad; random magnitudes) so that a few
    small steps from the near-uniform initial policy can follow it for every sample, not only on average.
    """
    module = load_script(name)
    ppo = build(module, **overrides)
    batch = random_minibatch(seed=5, masked_fraction=0.0)
    obs, actions = frames_for(name, batch["obs"]), batch["actions"]
    batch["advantages"] = (batch["advantages"].abs() + 0.1) * torch.where(actions < 2, 1.0, -1.0)
    with torch.no_grad():
        _, logprobs_before, _, values = ppo.agent.get_action_and_value(obs, actions)
    # On-policy data: the old log-probabilities and values are the agent's own.
    batch.update(logprobs=logprobs_before, values=values.flatten(), returns=values.flatten() + batch["advantages"])
    for _ in range(4):
        losses = call_update(ppo, name, batch)
    assert set(losses.keys()) == LOSS_NAMES
    with torch.no_grad():
        _, logprobs_after, _, _ = ppo.agent.get_action_and_value(obs, actions)
    change = logprobs_after - logprobs_before
    positive = batch["advantages"] > 0
    assert 0 < positive.sum() < BATCH
    print(f"{name} {overrides}: mean log-prob change {change[positive].mean():.4f} (A > 0), "
          f"{change[~positive].mean():.4f} (A < 0)")  # fmt: skip
    assert (change[positive] > 0).all(), f"actions with A > 0 that became less likely: {change[positive]}"
    assert (change[~positive] < 0).all(), f"actions with A < 0 that became more likely: {change[~positive]}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_masked_steps_do_not_change_the_update(name):
    """Steps with mask 0 (envpool's reset steps) have no effect: changing their data changes nothing."""
    module = load_script(name)
    first, second = build(module), build(module)
    batch = random_minibatch(seed=11)
    masked = batch["mask"] == 0
    assert 0 < masked.sum() < BATCH
    other = dict(batch)
    noise = random_minibatch(seed=12)
    for key in ("obs", "actions", "logprobs", "advantages", "returns", "values"):
        other[key] = torch.where(masked.view(-1, *[1] * (batch[key].dim() - 1)), noise[key], batch[key])
    for round_ in range(2):
        losses_first, losses_second = detached(call_update(first, name, batch)), call_update(second, name, other)
        assert_leaves_close(detached(losses_second), losses_first, f"round {round_} losses")
        assert_leaves_close(params(second), params(first), f"round {round_} parameters")
    # And the masked data does matter once it is unmasked.
    third = build(module)
    call_update(third, name, dict(other, mask=torch.ones(BATCH)))
    call_update(third, name, dict(other, mask=torch.ones(BATCH)))
    assert any(not torch.allclose(params(third)[k], params(first)[k]) for k in params(first)), "mask has no effect"


# --- 2. GAE ---------------------------------------------------------------------------------------------------------


def reference_advantages(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """GAE the textbook way, one env at a time, in float64: an episode end cuts both the bootstrap and the sum."""
    rewards, values, dones = (np.asarray(x, dtype=np.float64) for x in (rewards, values, dones))
    num_steps, num_envs = rewards.shape
    advantages = np.zeros((num_steps, num_envs))
    for env in range(num_envs):
        following = 0.0  # the advantage of the next step
        for t in reversed(range(num_steps)):
            if t == num_steps - 1:
                ends, bootstrap = bool(next_done[env]), float(next_value[env])
            else:
                ends, bootstrap = bool(dones[t + 1, env]), values[t + 1, env]
            if ends:  # observation t + 1 is the last frame of the episode: nothing after it counts
                following = rewards[t, env] - values[t, env]
            else:
                following = rewards[t, env] + gamma * bootstrap - values[t, env] + gamma * gae_lambda * following
            advantages[t, env] = following
    return torch.tensor(advantages, dtype=torch.float32)


def random_rollout(num_steps, num_envs, seed):
    generator = torch.Generator().manual_seed(seed)
    return dict(
        rewards=torch.randn(num_steps, num_envs, generator=generator),
        values=torch.randn(num_steps, num_envs, generator=generator),
        dones=(torch.rand(num_steps, num_envs, generator=generator) < 0.1).float(),
        next_value=torch.randn(num_envs, generator=generator),
        next_done=torch.tensor([1.0] + [0.0] * (num_envs - 1)),
    )


@pytest.mark.parametrize(
    ("name", "compile_"), [(PLAIN, False), (TWIN, False), (TWIN, True)], ids=["plain", "twin", "twin-compile"]
)
@pytest.mark.parametrize("device", DEVICES)
def test_gae_matches_reference(device, name, compile_):
    module = load_script(name)
    compute = torch.compile(module.compute_advantages) if compile_ else module.compute_advantages

    def gae(**rollout):
        """The advantages computed on `device`, brought back to the CPU."""
        advantages = compute(**{key: value.to(device) if torch.is_tensor(value) else value
                                for key, value in rollout.items()})  # fmt: skip
        assert advantages.device.type == device
        return advantages.cpu()

    for num_steps, num_envs, seed in ((128, 8, 0), (37, 3, 1), (1, 2, 2)):
        rollout = random_rollout(num_steps, num_envs, seed)
        assert 0 < rollout["dones"].sum() < rollout["dones"].numel() or num_steps == 1
        expected = reference_advantages(**rollout, gamma=0.99, gae_lambda=0.95)
        actual = gae(**rollout, gamma=0.99, gae_lambda=0.95)
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m, n=num_steps: f"T={n}: {m}")
    # No episode end: the advantage of step 0 is the discounted sum of all deltas (checked against a closed form).
    rollout = random_rollout(16, 2, seed=3)
    rollout.update(dones=torch.zeros(16, 2), next_done=torch.zeros(2))
    next_values = torch.cat([rollout["values"][1:], rollout["next_value"][None]])
    deltas = rollout["rewards"] + 0.9 * next_values - rollout["values"]
    closed_form = (deltas * (0.9 * 0.5) ** torch.arange(16.0)[:, None]).sum(0)
    torch.testing.assert_close(gae(**rollout, gamma=0.9, gae_lambda=0.5)[0], closed_form, rtol=RTOL, atol=ATOL)


# --- 3. Compiled and eager updates of the twin agree, captured and not; the twin computes what the plain script does -
#
# Each update starts from bit-identical parameters: SameUpdates (checks.py) checks the gradients (clipped, as Adam
# used them) tightly and the steps of Adam within its step size where a gradient is at its rounding noise, then copies
# the reference side's parameters into the other side, in place.


def learning_rate(ppo):
    return float(ppo.optimizer.param_groups[0]["lr"])


@pytest.mark.parametrize("device", DEVICES)
def test_twin_compiled_update_policy_and_gae_match_eager(device, inductor_fallback_random):
    module = load_script(TWIN)
    eager, compiled = build(module, device, compile=False), build(module, device, compile=True)
    start = params(eager)
    assert_leaves_close(params(compiled), start, "initial parameters", rtol=0, atol=0)

    def act(ppo):
        torch.manual_seed(42)
        return [tensor.clone() for _ in range(2) for tensor in ppo.policy(obs)] + [ppo.value(obs).clone()]

    def check_acting(what):
        outputs = {"eager": act(eager), "compiled": act(compiled)}
        for index, (actual, expected) in enumerate(zip(outputs["compiled"], outputs["eager"], strict=True)):
            torch.testing.assert_close(
                actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m, i=index: f"{what} {i}: {m}"
            )
        assert not torch.equal(outputs["eager"][0], outputs["eager"][3]), "the policy does not sample"
        return outputs["eager"]

    obs = random_minibatch(seed=7, size=8, device=device)["obs"]
    acting_before = check_acting("policy before the updates")
    check = SameUpdates("update")
    for round_ in range(3):  # several rounds: Adam's moments and step count take part
        batch = random_minibatch(seed=100 + round_, device=device)
        losses = {
            label: detached(call_update(ppo, TWIN, batch)) for label, ppo in (("eager", eager), ("compiled", compiled))
        }
        assert set(losses["eager"]) == LOSS_NAMES
        assert_leaves_close(losses["compiled"], losses["eager"], f"round {round_} losses")
        check.check(compiled.agent, eager.agent, learning_rate(eager), f"round {round_}")
        # The learning rate lives in a tensor: annealing it between rounds must reach both.
        for ppo in (eager, compiled):
            ppo.optimizer.param_groups[0]["lr"].mul_(0.5)
    assert_changed(start, params(eager), "eager twin's parameters")
    # The compiled policy follows the updates (it reads the parameters' storage, it did not keep copies).
    acting_after = check_acting("policy after the updates")
    assert not torch.equal(acting_after[-1], acting_before[-1]), "the values did not change with the updates"

    rollout = random_rollout(128, 8, seed=9)
    expected = reference_advantages(**rollout, gamma=0.99, gae_lambda=0.95)  # the Args defaults
    rollout = {key: value.to(device) for key, value in rollout.items()}
    torch.testing.assert_close(eager.gae(**rollout).cpu(), expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(compiled.gae(**rollout), eager.gae(**rollout), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("device", DEVICES)
def test_twin_bf16_update_and_values_are_fp32_within_rounding(device, inductor_fallback_random):
    module = load_script(TWIN)
    check_bf16_update_is_fp32_within_rounding(
        lambda **overrides: build(module, device, **overrides),
        lambda ppo, batch: call_update(ppo, TWIN, batch),
        lambda ppo: ppo.agent,
        [random_minibatch(seed=500, device=device), random_minibatch(seed=501, device=device)],
        lambda ppo, obs: ppo.value(obs),
        variants=("eager", "compiled"),
    )


@requires_cuda
def test_twin_captured_update_policy_and_gae_match_uncaptured(inductor_fallback_random):
    """CudaGraphModule(warmup=5): calls 1-4 run eagerly on a side stream, call 5 runs once and records the graph,
    calls 6-8 replay it. Each call is compared with the uncaptured compiled twin's. The learning rate is a tensor
    written in place between calls (annealing); before call 7 other parameters are written in place, and the
    learning rate set to 0: the replays follow both (the parameters do not move, acting sees the new ones)."""
    module = load_script(TWIN)
    uncaptured = build(module, "cuda", compile=True)
    captured = build(module, "cuda", compile=True, cudagraphs=True)
    assert_leaves_close(params(captured), params(uncaptured), "initial parameters", rtol=0, atol=0)
    check = SameUpdates("update")
    for call in range(1, 9):
        lr = 0.0 if call == 7 else 2.5e-4 * (1 - call / 10)
        if call == 7:
            others = build(module, "cuda", seed=1)
            for ppo in (uncaptured, captured):
                sync_(ppo.agent, others.agent)
        for ppo in (uncaptured, captured):
            ppo.optimizer.param_groups[0]["lr"].fill_(lr)

        obs = random_minibatch(seed=1000 + call, size=8, device="cuda")["obs"]
        outputs = {}
        for label, ppo in (("uncaptured", uncaptured), ("captured", captured)):
            torch.manual_seed(100 * call)
            outputs[label] = [*ppo.policy(obs), ppo.value(obs)]
        for index, (actual, expected) in enumerate(zip(outputs["captured"], outputs["uncaptured"], strict=True)):
            torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m, i=index: f"{i}: {m}")

        batch = random_minibatch(seed=call, device="cuda")
        losses = {
            label: detached(call_update(ppo, TWIN, batch))
            for label, ppo in (("uncaptured", uncaptured), ("captured", captured))
        }
        assert_leaves_close(losses["captured"], losses["uncaptured"], f"call {call} losses")
        if call == 7:
            assert_leaves_close(params(captured), params(others), "parameters after a step of lr 0", rtol=0, atol=0)
        check.check(captured.agent, uncaptured.agent, lr, f"call {call}", grads=call != 5)  # 5: recorded

        rollout = random_rollout(32, 4, seed=call)
        expected = reference_advantages(**rollout, gamma=0.99, gae_lambda=0.95)
        rollout = {key: value.to("cuda") for key, value in rollout.items()}
        advantages = {label: ppo.gae(**rollout) for label, ppo in (("uncaptured", uncaptured), ("captured", captured))}
        torch.testing.assert_close(advantages["captured"], advantages["uncaptured"], rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(advantages["captured"].cpu(), expected, rtol=RTOL, atol=ATOL)
    for function in ("update", "policy", "value", "gae"):
        assert getattr(captured, function).counter == 5, f"{function} was not captured"


@requires_cuda
def test_twin_captured_policy_samples_anew_at_each_replay():
    """The twin as a run with --compile --cudagraphs uses it: after the capture, two replays on the same frames sample
    other actions; seeded alike, they sample the same."""
    ppo = build(load_script(TWIN), "cuda", compile=True, cudagraphs=True)
    obs = random_minibatch(seed=7, size=16, device="cuda")["obs"]
    for _ in range(6):  # the 5th call records the graph, the 6th replays it
        ppo.policy(obs)
    assert ppo.policy.counter == 5
    first, second = ppo.policy(obs)[0], ppo.policy(obs)[0]
    # 16 draws from a near-uniform policy over 4 actions: all equal by chance with a probability of about 4e-10.
    assert not torch.equal(first, second), "two replays of the policy drew the same actions"
    replays = []
    for _ in range(2):
        torch.manual_seed(3)
        replays.append(ppo.policy(obs)[0])
    torch.testing.assert_close(replays[1], replays[0], rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_twin_eager_update_matches_plain(device):
    """Same start, same minibatches, same learning-rate schedule: the twin's updates compute the plain script's."""
    plain, twin = build(load_script(PLAIN), device), build(load_script(TWIN), device)
    sync_(twin.agent, plain.agent)
    start = params(plain)
    check = SameUpdates("update")
    for round_ in range(3):
        batch = random_minibatch(seed=200 + round_, device=device)
        plain_losses = detached(call_update(plain, PLAIN, batch))
        twin_losses = detached(call_update(twin, TWIN, batch))
        assert_leaves_close(twin_losses, plain_losses, f"round {round_} losses")
        check.check(twin.agent, plain.agent, learning_rate(plain), f"round {round_}")
        # Anneal the learning rate the way each script does.
        plain.optimizer.param_groups[0]["lr"] *= 0.5
        twin.optimizer.param_groups[0]["lr"].mul_(0.5)
    assert_changed(start, params(plain), "plain parameters")

    # The twin acts with a detached copy of its parameters: it must see the updates (the same storage).
    obs = random_minibatch(seed=8, size=8, device=device)["obs"]
    torch.manual_seed(3)
    plain_out = plain.policy(obs.float())
    torch.manual_seed(3)
    twin_out = twin.policy(obs)
    for actual, expected in zip(twin_out, plain_out, strict=True):
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(twin.value(obs), plain.value(obs.float()), rtol=RTOL, atol=ATOL)
    for path, parameter in twin.agent.named_parameters():
        module_path, _, attribute = path.rpartition(".")
        acting = getattr(twin.acting_agent.get_submodule(module_path), attribute)
        assert not acting.requires_grad, f"the acting copy of {path} requires grad"
        assert acting.data_ptr() == parameter.data_ptr(), f"the acting copy of {path} has its own storage"


def test_twin_built_again_computes_with_its_own_hyperparameters(inductor_fallback_random):
    check_a_second_build_computes_with_its_own_hyperparameters(TWIN, ppo_compiled_calls)


def ppo_compiled_calls(module, device="cpu", **overrides):
    """A build of the twin (single-process or distributed), each compiled function called once on the same inputs."""
    ppo = build(module, device, **overrides)
    batch = random_minibatch(seed=77, size=32, device=device)
    torch.manual_seed(8)
    outputs = flat(policy=ppo.policy(batch["obs"]), value=ppo.value(batch["obs"]))
    outputs.update(flat(gae=ppo.gae(**{k: v.to(device) for k, v in random_rollout(16, 4, seed=9).items()})))
    return {**outputs, **flat(losses=call_update(ppo, module.__name__, batch), agent=params(ppo))}


# --- 5. Bad input ---------------------------------------------------------------------------------------------------

BAD_INPUTS = {
    "unknown-env": (("--env-id", "NoSuchGame-v5"), ("NoSuchGame-v5",)),
    "mujoco-env": (("--env-id", "HalfCheetah-v5"), ("HalfCheetah-v5", "Atari")),
    "classic-env": (("--env-id", "CartPole-v1"), ("CartPole-v1", "Atari")),
    "minibatches-do-not-divide": (
        ("--num-envs", "2", "--num-steps", "32", "--num-minibatches", "3"),
        ("num-minibatches", "64"),
    ),
    "zero-envs": (("--num-envs", "0"), ("num-envs",)),
    "negative-steps": (("--num-steps", "-8"), ("num-steps",)),
    "zero-timesteps": (("--total-timesteps", "0"), ("total-timesteps",)),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
@pytest.mark.parametrize("name", SCRIPTS)
def test_bad_input_exits_2_with_one_clear_line(name, case, tmp_path, capsys):
    flags, expected_words = BAD_INPUTS[case]
    check_bad_input_in_process(name, flags, expected_words, tmp_path, capsys)


# --- 6. Runs: determinism and the game's real returns ---------------------------------------------------------------

# Asterix: 3 lives, rewards of 50 and more (clipped to 1), games of about 200-350 steps under a near-uniform policy.
# 768 steps per env: about five finished games in all, and life losses in the last rollout.
RUN = ("--env-id", "Asterix-v5", "--num-envs", "2", "--num-steps", "128", "--total-timesteps", "1536",
       "--num-minibatches", "2", "--update-epochs", "1")  # fmt: skip


@pytest.fixture(scope="module")
def recorded_run():
    """recorded_run(name, seed): (the globals of a run of RUN, the envpool steps it made); helpers.recorded_runs."""
    return recorded_runs(RUN)


@pytest.mark.parametrize("name", SCRIPTS)
def test_reported_returns_are_the_games_real_returns(name, recorded_run):
    """episode_returns holds whole games (all lives) scored with the game's own rewards, not the clipped ones."""
    run_globals, steps = recorded_run(name, 1)
    game_returns = episode_sums(steps, "game_reward", ("game_over", "truncated"))
    # The run must tell the right returns apart from the wrong ones, or the test would prove nothing.
    clipped_returns = episode_sums(steps, "clipped_reward", ("game_over", "truncated"))
    per_life_returns = episode_sums(steps, "game_reward", ("life_lost", "truncated"))
    assert len(game_returns) >= 3, game_returns
    assert clipped_returns != game_returns and per_life_returns != game_returns
    assert len(per_life_returns) > len(game_returns)

    assert run_globals["episode_returns"] == game_returns
    assert all(isinstance(value, float) for value in run_globals["episode_returns"])


@pytest.mark.parametrize("name", SCRIPTS)
def test_reset_steps_are_masked_out_of_the_last_rollout(name, recorded_run):
    """The step after an episode's end is envpool's reset step (its action is ignored): mask 0 there, 1 elsewhere."""
    run_globals, steps = recorded_run(name, 1)
    num_steps = int(RUN[RUN.index("--num-steps") + 1])
    ended = np.stack([step["life_lost"] | step["truncated"] for step in steps]).astype(np.float32)
    # Step k is a reset step when step k - 1 ended an episode; the last rollout is the last num_steps steps.
    expected_mask = 1.0 - ended[-num_steps - 1 : -1]
    if name == PLAIN:
        mask = run_globals["b_mask"].reshape(num_steps, -1)
    else:
        mask = run_globals["rollout"]["mask"]
    assert (expected_mask == 0).sum() >= 1, "no episode ended in the last rollout: the test proves nothing"
    np.testing.assert_array_equal(mask.numpy(), expected_mask)


@pytest.mark.parametrize("name", SCRIPTS)
def test_same_seed_same_returns(name, recorded_run):
    first = recorded_run(name, 1)[0]["episode_returns"]
    second = run_in_process(name, *RUN, "--seed", 1)["episode_returns"]
    assert len(first) >= 3, first
    assert second == first
    other = recorded_run(name, 2)[0]["episode_returns"]
    assert len(other) >= 3, other
    assert other != first


def test_twin_run_matches_plain_run(recorded_run):
    """Same seed and flags: the twin (eager) plays the same games and ends with the plain script's parameters.

    Both draw the same random numbers in the same order and compute the same losses; float32 rounding differs
    (fused Adam, the parallel-scan GAE) far below what could change a sampled action in so short a run. The end
    parameters agree within what Adam's steps allow (see assert_params_close_after_steps).
    """
    plain_globals, plain_steps = recorded_run(PLAIN, 1)
    twin_globals, twin_steps = recorded_run(TWIN, 1)
    assert twin_globals["episode_returns"] == plain_globals["episode_returns"]
    assert len(twin_steps) == len(plain_steps)
    args = plain_globals["args"]
    iterations = plain_globals["num_iterations"]
    assert (args.anneal_lr, iterations) == (True, 6), "RUN changed: the learning rates below follow it"
    lrs = [(1 - i / iterations) * args.learning_rate for i in range(iterations)]
    lrs = [lr for lr in lrs for _ in range(args.update_epochs * args.num_minibatches)]
    twin_agent, plain_agent = built(twin_globals["ppo"], "agent"), built(plain_globals["ppo"], "agent")
    assert_params_close_after_steps(twin_agent, plain_agent, lrs, "parameters at the end of the run")
    assert_changed(params(build(load_script(PLAIN), seed=1)), params(plain_globals["ppo"]), "plain parameters")


# --- 8. Checkpoints: resume, the layout, refused checkpoints, video (flags, results, signals: test_scripts.py) -----
#
# Iterations of 2 envs x 16 steps and one minibatch update each: a checkpoint's step count is a multiple of 32.

TINY_FLAGS = ("--env-id", "Breakout-v5", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "1",
              "--update-epochs", "1")  # fmt: skip
BATCH_STEPS = 32


def learning_rate_of(checkpoint):
    return checkpoint["agent"]["optimizer"]["param_groups"][0]["lr"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_resume_continues_the_run_and_its_learning_rate_schedule(name, tmp_path, saved_checkpoints):
    """A run of 4 iterations saved after 2 and resumed from there ends as the uninterrupted run does: the same step
    and iteration counts, optimizer steps, and the last iteration's annealed learning rate (the schedule goes on from
    the checkpoint's iteration; it is not restarted). The mid-run checkpoint is no shorter run's end: --total-timesteps
    sets the schedule (same_as_shorter_run=False)."""
    resumed = check_resume_continues_the_run(name, TINY_FLAGS, tmp_path, saved_checkpoints, steps=2 * BATCH_STEPS,
                                             same_as_shorter_run=False)  # fmt: skip
    mid, full = saved_checkpoints[:2]
    assert (mid["iteration"], full["iteration"], resumed["iteration"]) == (2, 4, 4)
    learning_rate = load_script(name).Args.learning_rate
    # Iteration i of 4 anneals the learning rate to (1 - (i - 1) / 4) of its start: 3/4 at the checkpoint, 1/4 last.
    assert learning_rate_of(mid) == pytest.approx(0.75 * learning_rate)
    assert learning_rate_of(full) == pytest.approx(0.25 * learning_rate)
    assert learning_rate_of(resumed) == learning_rate_of(full)


def test_checkpoint_every_saves_after_each_iteration_reaching_a_multiple(tmp_path, saved_checkpoints):
    """--checkpoint-every 40 with 32 steps an iteration: saved after the iterations that reach 40 and 80 (steps 64
    and 96), then at the end (128); the last one is the checkpoint file."""
    model = tmp_path / "agent.pt"
    run_in_process(PLAIN, *TINY_FLAGS, "--total-timesteps", 4 * BATCH_STEPS, "--save-model", "--model-path", model,
                   "--checkpoint-every", "40", "--eval-episodes", "0")  # fmt: skip
    assert [checkpoint["global_step"] for checkpoint in saved_checkpoints] == [64, 96, 128]
    assert [checkpoint["iteration"] for checkpoint in saved_checkpoints] == [2, 3, 4]
    assert load_checkpoint(model)["global_step"] == 128
    assert not (tmp_path / "agent.pt.tmp").exists(), "the temporary file is renamed into place"


def test_twin_reads_and_writes_the_plain_layout():
    """The twin loads the plain script's agent and optimizer state in place (its acting copy and its compiled step
    read the same storage and the same lr tensor, fused again), saves them back unchanged, learning rate a Python
    float included, and makes the plain script's next update (Adam's moments and step count came across)."""
    plain, twin = build(load_script(PLAIN), seed=1), build(load_script(TWIN), seed=2)
    for round_ in range(2):  # Adam's moments and step count are not zero
        call_update(plain, PLAIN, random_minibatch(seed=300 + round_))
    plain.set_learning_rate(1e-4 / 3)  # not a float32 number
    lr_tensor = twin.optimizer.param_groups[0]["lr"]
    twin.load_state_dict(copy.deepcopy(plain.state_dict()))  # as from a file: the optimizers share no tensor
    group = twin.optimizer.param_groups[0]
    assert group["lr"] is lr_tensor and group["fused"] is True and group["capturable"] is False
    assert_same_state(twin.state_dict(), plain.state_dict())
    for path, parameter in twin.agent.named_parameters():
        module_path, _, attribute = path.rpartition(".")
        acting = getattr(twin.acting_agent.get_submodule(module_path), attribute)
        assert acting.data_ptr() == parameter.data_ptr(), f"the acting copy of {path} has its own storage"
    obs = random_minibatch(seed=8, size=8)["obs"]
    torch.testing.assert_close(twin.value(obs), plain.value(obs.float()), rtol=RTOL, atol=ATOL)

    batch = random_minibatch(seed=310)
    assert_leaves_close(detached(call_update(twin, TWIN, batch)), detached(call_update(plain, PLAIN, batch)), "losses")
    SameUpdates("update").check(twin.agent, plain.agent, learning_rate(plain), "the update after loading")
    assert {state["step"].item() for state in twin.optimizer.state.values()} == {3.0}


class RecordingEvalEnvs(RecordingEnvs):
    """RecordingEnvs that also keeps the first observation of each reset."""

    def __init__(self, envs):
        super().__init__(envs)
        self.reset_frames = []

    def reset(self, *args, **kwargs):
        obs, info = self._envs.reset(*args, **kwargs)
        self.reset_frames.append(obs[0, -1].copy())
        return obs, info


def games(steps):
    """The steps of a single env split into games, each ending where the game is over (or cut by the time limit)."""
    games, current = [], []
    for step in steps:
        current.append(step)
        if step["game_over"][0] or step["truncated"][0]:
            games.append(current)
            current = []
    return games


def test_video_of_the_evaluation(tmp_path, monkeypatch):
    """--capture-video: one playable MP4 per evaluation game beside the checkpoint, of the agent's 84x84 view (the
    newest frame of its observation), a frame per step of the game; the eval return is the mean of the games' real
    returns (all lives, unclipped rewards)."""
    import imageio.v3 as iio

    made, real_make = [], envpool.make

    def make(*args, **kwargs):
        made.append(RecordingEvalEnvs(real_make(*args, **kwargs)))
        return made[-1]

    monkeypatch.setattr(envpool, "make", make)
    results = tmp_path / "results.jsonl"
    run_in_process(TWIN, *TINY_FLAGS, "--total-timesteps", BATCH_STEPS, "--save-model", "--model-path",
                   tmp_path / "run" / "agent.pt", "--eval-episodes", "2", "--capture-video",
                   "--results-path", results)  # fmt: skip
    eval_envs = made[-1]
    assert eval_envs.spec.config.num_envs == 1 and eval_envs.spec.config.seed == 1 + 10_000
    played = games(eval_envs.steps)
    assert len(played) == 2 and len(eval_envs.reset_frames) == 2, "two games, each from a reset"
    videos = sorted((tmp_path / "run" / "videos").glob("*.mp4"))
    assert [video.name for video in videos] == ["eval-episode-0.mp4", "eval-episode-1.mp4"]
    for video, game, first_frame in zip(videos, played, eval_envs.reset_frames, strict=True):
        frames = iio.imread(video)
        assert frames.shape == (len(game), 84, 84, 3), (frames.shape, len(game))
        # Grey: the channels agree; the first frame is the game's first observation (up to the codec's losses).
        assert (frames[..., 0] == frames[..., 1]).all() and (frames[..., 0] == frames[..., 2]).all()
        assert np.abs(frames[0, ..., 0].astype(float) - first_frame).mean() < 3, "not the observation's newest frame"
        assert frames.max() > 0
    game_returns = [sum(float(step["game_reward"][0]) for step in game) for game in played]
    assert read_results(results)[0]["eval_return"] == pytest.approx(np.mean(game_returns))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [TWIN, "pqn_atari_envpool_torchcompile", "ppo_atari_envpool_distributed_torchcompile"])
def test_atari_frames_reach_the_device_unchanged(name, device):
    """make_frames_to_device, as each Atari twin has it, gives the env's uint8 frames on the device. On the CPU: the
    env's own array (no copy). On a GPU: a copy through one pinned buffer that returns before it is done
    (non_blocking), which two writes could reach while it is in flight: the env's next step, which writes the array
    the frames came in, and the next call, which writes the buffer. Here the device's stream is held up by a spin
    kernel, so that the first copy is still queued when the env's array is overwritten and the next calls are made."""
    batches = [np.random.default_rng(seed).integers(0, 256, (8, 4, 84, 84), dtype=np.uint8) for seed in range(4)]
    frames_to_device = load_script(name).make_frames_to_device(batches[0].shape, torch.device(device))
    if device == "cpu":
        on_device = frames_to_device(batches[0])
        assert on_device.dtype == torch.uint8 and on_device.device.type == "cpu"
        assert on_device.data_ptr() == batches[0].ctypes.data
        return
    stream = torch.cuda.current_stream()
    env_frames = batches[0].copy()  # the env's array: each step writes its frames there
    torch.cuda._sleep(10**9)  # about half a second of spinning: the first copy waits behind it
    on_device = [frames_to_device(env_frames)]
    in_flight = not stream.query()
    env_frames[:] = 0
    for frames in batches[1:]:
        env_frames[:] = frames
        on_device.append(frames_to_device(env_frames))
    env_frames[:] = 0
    torch.cuda.synchronize()
    assert in_flight, (
        "frames_to_device waited for the device: its copy is not asynchronous, and the test proves nothing"
    )
    for copied, frames in zip(on_device, batches, strict=True):
        assert copied.dtype == torch.uint8 and copied.device.type == "cuda"
        assert torch.equal(copied.cpu(), torch.from_numpy(frames))


# --- run.sh's tiny run of the pair: the results line, every flag combination of the twin (test_scripts.py's checks) ---
