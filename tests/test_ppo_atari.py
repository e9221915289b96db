"""What the Atari pairs (PPO, its distributed pair, PQN) share, parametrized over the scripts, and PPO Atari's own
tests, through the scripts' stable interface (Args, build_ppo/build_pqn, the command line, a run's globals). Plain
scripts keep frames as float32, twins as uint8."""

import copy

import envpool
import numpy as np
import pytest
import torch
import torch.distributed as dist
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
    default_dtype,
    episode_sums,
    load_script,
    one_torch_thread,
    read_results,
    recorded_runs,
    recording_make,
    requires_cuda,
    run_in_process,
)
from tensordict import TensorDict

PPO, PQN, DISTRIBUTED = PLAINS = ("ppo_atari_envpool", "pqn_atari_envpool", "ppo_atari_envpool_distributed")
PPO_TWIN, PQN_TWIN, DISTRIBUTED_TWIN = TWINS = tuple(f"{plain}_torchcompile" for plain in PLAINS)
NUM_ACTIONS, BATCH = 4, 64
UPDATE_KEYS = {
    "ppo": ("obs", "actions", "logprobs", "advantages", "returns", "values", "mask"),
    "pqn": ("obs", "actions", "returns", "mask"),
}


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():  # the CNN's OpenMP threads wait for one another on a small shared machine
        yield


@pytest.fixture
def world_of_one(name, device):
    """A distributed script's process group of this process alone, as a plain launch makes it."""
    if "distributed" in name:
        dist.init_process_group("nccl" if device == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if "distributed" in name:
        dist.destroy_process_group()


def algo(name):
    return "pqn" if "pqn" in name else "ppo"


def is_twin(name):
    return "_torchcompile" in name


def build(module, device="cpu", seed=0, **arg_overrides):
    """An Atari script's agent, its network as .network and a twin's acting copy as .acting."""
    module = load_script(module) if isinstance(module, str) else module
    torch.manual_seed(seed)
    args = module.Args(**arg_overrides)
    network = "qnet" if hasattr(module, "build_pqn") else "agent"
    agent = (module.build_pqn if network == "qnet" else module.build_ppo)(NUM_ACTIONS, args, torch.device(device))
    agent.network = built(agent, network)
    if hasattr(args, "compile"):
        agent.acting = built(agent, f"acting_{network}")
    return agent


def params(agent):
    return {name: value.detach().clone() for name, value in agent.network.state_dict().items()}


def learning_rate(agent):
    return float(agent.optimizer.param_groups[0]["lr"])


def random_minibatch(seed, size=BATCH, masked_fraction=0.25, device="cpu"):
    """Random uint8 frames and rollout quantities, some steps masked out (reset steps)."""
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


def random_rollout(num_steps, num_envs, seed, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    rollout = dict(
        rewards=torch.randn(num_steps, num_envs, generator=generator),
        values=torch.randn(num_steps, num_envs, generator=generator),
        dones=(torch.rand(num_steps, num_envs, generator=generator) < 0.1).float(),
        next_value=torch.randn(num_envs, generator=generator),
        next_done=torch.tensor([1.0] + [0.0] * (num_envs - 1)),
    )
    return {key: value.to(device) for key, value in rollout.items()}


def frames_for(name, obs):
    """Frames as an update takes them: floats in a plain script, channels-last uint8 in a twin."""
    return obs.contiguous(memory_format=torch.channels_last) if is_twin(name) else obs.to(torch.get_default_dtype())


def call_update(agent, name, batch):
    keys = UPDATE_KEYS[algo(name)]
    tensors = [frames_for(name, batch["obs"]), *(batch[key] for key in keys[1:])]
    if not is_twin(name):
        return agent.update(*tensors)
    return agent.update(TensorDict(dict(zip(keys, tensors, strict=True)), batch_size=[len(tensors[0])]))


def act(agent, name, obs, draws=1, seed=3, epsilon=0.5):
    """{output: tensor} of `draws` calls of the policy (seeded unless seed is None) and the values on uint8 frames."""
    frames = obs if is_twin(name) else obs.to(torch.get_default_dtype())
    epsilons = () if algo(name) == "ppo" else (torch.tensor(epsilon, device=obs.device) if is_twin(name) else epsilon,)
    if seed is not None:
        torch.manual_seed(seed)
    policy = [[output.clone() for output in agent.policy(frames, *epsilons)] for _ in range(draws)]
    return flat(**{f"draw {draw}": outputs for draw, outputs in enumerate(policy)}, value=agent.value(frames))


def returns_of(agent, name, rollout):
    return (agent.q_lambda_returns if algo(name) == "pqn" else agent.gae)(**rollout)


@pytest.mark.parametrize(
    ("name", "overrides"), [(PPO, {}), (PPO_TWIN, {}), (PPO_TWIN, {"compile": True})], ids=["plain", "twin", "compile"]
)
def test_update_raises_probability_of_positive_advantage_actions(name, overrides):
    """Four updates on one on-policy batch make every action with A > 0 likelier and every one with A < 0 less likely
    (the sign tied to the action, so that a few small steps can follow it for every sample)."""
    ppo = build(name, **overrides)
    batch = random_minibatch(seed=5, masked_fraction=0.0)
    obs, actions = frames_for(name, batch["obs"]), batch["actions"]
    batch["advantages"] = (batch["advantages"].abs() + 0.1) * torch.where(actions < 2, 1.0, -1.0)
    with torch.no_grad():
        _, logprobs_before, _, values = ppo.network.get_action_and_value(obs, actions)
    batch.update(logprobs=logprobs_before, values=values.flatten(), returns=values.flatten() + batch["advantages"])
    for _ in range(4):
        losses = call_update(ppo, name, batch)
    assert set(losses.keys()) == {"pg_loss", "v_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac"}
    with torch.no_grad():
        _, logprobs_after, _, _ = ppo.network.get_action_and_value(obs, actions)
    change = logprobs_after - logprobs_before
    positive = batch["advantages"] > 0
    assert 0 < positive.sum() < BATCH
    assert (change[positive] > 0).all(), f"actions with A > 0 that became less likely: {change[positive]}"
    assert (change[~positive] < 0).all(), f"actions with A < 0 that became more likely: {change[~positive]}"


@pytest.mark.parametrize("name", [PPO, PPO_TWIN, PQN, PQN_TWIN])
def test_masked_steps_do_not_change_the_update(name):
    """Two rounds of updates of a minibatch with masked steps (envpool's reset steps) are those of its other steps
    alone, whatever the masked steps hold; unmasked, that other data changes the update."""
    batch, noise = random_minibatch(seed=11), random_minibatch(seed=12)
    masked = batch["mask"] == 0
    assert 0 < masked.sum() < BATCH
    other = dict(batch)
    for key in UPDATE_KEYS[algo(name)][:-1]:
        other[key] = torch.where(masked.view(-1, *[1] * (batch[key].dim() - 1)), noise[key], batch[key])
    minibatches = {
        "masked": batch,
        "other data masked": other,
        "unmasked steps alone": {key: value[~masked] for key, value in batch.items()},
        "other data unmasked": dict(other, mask=torch.ones(BATCH)),
    }
    agents = {label: build(name) for label in minibatches}
    checks = {label: SameUpdates(label) for label in ("other data masked", "unmasked steps alone")}
    for round_ in range(2):
        lr = learning_rate(agents["masked"])
        losses = {label: detached(call_update(agents[label], name, data)) for label, data in minibatches.items()}
        for label, check in checks.items():
            assert_leaves_close(losses[label], losses["masked"], f"round {round_}, {label}: losses")
            check.check(agents[label].network, agents["masked"].network, lr, f"round {round_}")
        assert_changed(params(agents["other data unmasked"]), params(agents["masked"]), f"round {round_}: unmasking")


def reference_advantages(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """GAE the textbook way, one env at a time, in float64: an episode end cuts both the bootstrap and the sum."""
    rewards, values, dones = (np.asarray(x, dtype=np.float64) for x in (rewards, values, dones))
    num_steps, num_envs = rewards.shape
    advantages = np.zeros((num_steps, num_envs))
    for env in range(num_envs):
        following = 0.0  # the advantage of the next step
        for t in reversed(range(num_steps)):
            last = t == num_steps - 1
            if next_done[env] if last else dones[t + 1, env]:  # observation t + 1 ends the episode: nothing after it
                following = rewards[t, env] - values[t, env]
            else:
                bootstrap = float(next_value[env]) if last else values[t + 1, env]
                following = rewards[t, env] + gamma * bootstrap - values[t, env] + gamma * gae_lambda * following
            advantages[t, env] = following
    return torch.tensor(advantages, dtype=torch.float32)


@pytest.mark.parametrize("name", [PPO, PPO_TWIN, DISTRIBUTED, DISTRIBUTED_TWIN])
def test_gae_matches_reference(name):
    """compute_advantages (a scan in the twins) against the textbook's, and with no episode end the closed form."""
    compute = load_script(name).compute_advantages
    for num_steps, num_envs, seed in ((128, 8, 0), (37, 3, 1), (1, 2, 2)):
        rollout = random_rollout(num_steps, num_envs, seed)
        assert 0 < rollout["dones"].sum() < rollout["dones"].numel() or num_steps == 1
        expected = reference_advantages(**rollout, gamma=0.99, gae_lambda=0.95)
        actual = compute(**rollout, gamma=0.99, gae_lambda=0.95)
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m, n=num_steps: f"T={n}: {m}")
    rollout = dict(random_rollout(16, 2, seed=3), dones=torch.zeros(16, 2), next_done=torch.zeros(2))
    next_values = torch.cat([rollout["values"][1:], rollout["next_value"][None]])
    deltas = rollout["rewards"] + 0.9 * next_values - rollout["values"]
    closed_form = (deltas * (0.9 * 0.5) ** torch.arange(16.0)[:, None]).sum(0)
    torch.testing.assert_close(compute(**rollout, gamma=0.9, gae_lambda=0.5)[0], closed_form, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", PLAINS)
def test_twin_loads_updates_and_acts_as_the_plain_script(name, device, world_of_one):
    """The twin loads the plain script's state in place (its lr tensor, its optimizer settings, acting sharing the
    parameters) and saves it back unchanged; then its updates and draws are the plain script's."""
    twin_name = f"{name}_torchcompile"
    plain, twin = build(name, device, seed=1), build(twin_name, device, seed=2)
    for round_ in range(2):
        call_update(plain, name, random_minibatch(seed=300 + round_, device=device))
    plain.set_learning_rate(1e-4 / 3)  # not a float32 number
    settings = {key: value for key, value in twin.optimizer.param_groups[0].items() if key != "params"}
    twin.load_state_dict(copy.deepcopy(plain.state_dict()))  # as from a file: the optimizers share no tensor
    group = twin.optimizer.param_groups[0]
    assert group["lr"] is settings.pop("lr") and {key: group[key] for key in settings} == settings
    assert_same_state(twin.state_dict(), plain.state_dict())
    for path, parameter in twin.network.named_parameters():
        module_path, _, attribute = path.rpartition(".")
        acting = getattr(twin.acting.get_submodule(module_path), attribute)
        assert acting.data_ptr() == parameter.data_ptr() and not acting.requires_grad, path

    start, check = params(plain), SameUpdates("update")
    for round_ in range(3):
        batch = random_minibatch(seed=200 + round_, device=device)
        plain_losses = detached(call_update(plain, name, batch))
        assert_leaves_close(detached(call_update(twin, twin_name, batch)), plain_losses, f"round {round_} losses")
        check.check(twin.network, plain.network, learning_rate(plain), f"round {round_}")
        for agent in (plain, twin):
            agent.set_learning_rate(learning_rate(agent) * 0.5)
    assert_changed(start, params(plain), "plain parameters")
    assert {state["step"].item() for state in twin.optimizer.state.values()} == {5.0}
    obs = random_minibatch(seed=8, size=32, device=device)["obs"]
    assert_leaves_close(act(twin, twin_name, obs), act(plain, name, obs), "acting after the updates")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", TWINS)
def test_twin_compiled_matches_eager(name, device, world_of_one, inductor_fallback_random):
    """The compiled update, acting and returns are the eager twin's, round after round, the lr annealed in place."""
    # PQN on CUDA in float64: in float32 its first conv's gradients were 3.5% apart (H200), rounding alone.
    with default_dtype(torch.float64 if device == "cuda" and algo(name) == "pqn" else torch.float32):
        eager, compiled = build(name, device, compile=False), build(name, device, compile=True)
        obs = random_minibatch(seed=7, size=16, device=device)["obs"]
        before = [act(agent, name, obs, draws=2, seed=42) for agent in (compiled, eager)]
        assert_leaves_close(*before, "acting before the updates")
        assert not torch.equal(before[1]["draw 0.0"], before[1]["draw 1.0"]), "the policy does not sample"
        check = SameUpdates("update")
        for round_ in range(3):
            batch = random_minibatch(seed=100 + round_, device=device)
            losses = [detached(call_update(agent, name, batch)) for agent in (compiled, eager)]
            assert_leaves_close(*losses, f"round {round_} losses")
            check.check(compiled.network, eager.network, learning_rate(eager), f"round {round_}")
            for agent in (eager, compiled):
                agent.set_learning_rate(learning_rate(agent) * 0.5)
        after = [act(agent, name, obs, draws=2, seed=42) for agent in (compiled, eager)]
        assert_leaves_close(*after, "acting after the updates")
        assert not torch.equal(after[0]["value"], before[0]["value"]), "compiled acting did not see the updates"
        rollout = random_rollout(32, 2, seed=9)  # run.sh's tiny shapes: their compiles hit this cache
        expected = returns_of(build(name), name, rollout)  # eager on the CPU, as tested against the definition
        on_device = {key: value.to(device) for key, value in rollout.items()}
        torch.testing.assert_close(returns_of(eager, name, on_device).cpu(), expected, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(returns_of(compiled, name, on_device).cpu(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", TWINS)
def test_twin_bf16_update_and_values_are_fp32_within_rounding(name, device, world_of_one, inductor_fallback_random):
    check_bf16_update_is_fp32_within_rounding(
        lambda **overrides: build(name, device, **overrides),
        lambda agent, batch: call_update(agent, name, batch),
        lambda agent: agent.network,
        [random_minibatch(seed=seed, device=device) for seed in (500, 501)],
        lambda agent, obs: agent.value(obs),
        variants=("eager", "compiled") if name == PPO_TWIN else ("eager",),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", TWINS)
def test_twin_built_again_computes_with_its_own_hyperparameters(name, device, world_of_one, inductor_fallback_random):
    def compiled_calls(module, **overrides):
        agent = build(module, device, **overrides)
        batch = random_minibatch(seed=77, size=32, device=device)
        outputs = act(agent, name, batch["obs"], seed=8)
        outputs.update(flat(returns=returns_of(agent, name, random_rollout(16, 4, seed=9, device=device))))
        return {**outputs, **flat(losses=call_update(agent, name, batch), network=params(agent))}

    check_a_second_build_computes_with_its_own_hyperparameters(name, compiled_calls)


@requires_cuda
@pytest.mark.parametrize("name", [PPO_TWIN, PQN_TWIN])
def test_twin_captured_matches_uncaptured(name, inductor_fallback_random):
    """Calls 1-8 of CudaGraphModule(warmup=5) (5 records, 6-8 replay) are the uncaptured twin's, with lr, epsilon and
    (call 7) parameters written in place between calls; replays draw new actions, the same when seeded alike."""
    uncaptured, captured = build(name, "cuda", compile=True), build(name, "cuda", compile=True, cudagraphs=True)
    assert_leaves_close(params(captured), params(uncaptured), "initial parameters", rtol=0, atol=0)
    check = SameUpdates("update")
    for call in range(1, 9):
        lr = 0.0 if call == 7 else 2.5e-4 * (1 - call / 10)
        if call == 7:
            others = build(name, "cuda", seed=1)
            for agent in (uncaptured, captured):
                sync_(agent.network, others.network)
        for agent in (uncaptured, captured):
            agent.set_learning_rate(lr)
        obs = random_minibatch(seed=1000 + call, size=8, device="cuda")["obs"]
        acting = [act(agent, name, obs, seed=100 * call, epsilon=0.1 * call) for agent in (captured, uncaptured)]
        assert_leaves_close(*acting, f"call {call} acting")
        batch = random_minibatch(seed=call, device="cuda")
        losses = [detached(call_update(agent, name, batch)) for agent in (captured, uncaptured)]
        assert_leaves_close(*losses, f"call {call} losses")
        if call == 7:
            assert_leaves_close(params(captured), params(others), "parameters after a step of lr 0", rtol=0, atol=0)
        check.check(captured.network, uncaptured.network, lr, f"call {call}", grads=call != 5)  # 5: recorded
        rollout = random_rollout(32, 4, seed=call, device="cuda")
        returns = [returns_of(agent, name, rollout) for agent in (captured, uncaptured)]
        torch.testing.assert_close(*returns, rtol=RTOL, atol=ATOL, msg=lambda m, c=call: f"call {c} returns: {m}")
    for function in ("update", "policy", "value", "q_lambda_returns" if algo(name) == "pqn" else "gae"):
        assert getattr(captured, function).counter == 5, f"{function} was not captured"
    obs = random_minibatch(seed=7, size=8, device="cuda")["obs"]  # the shape the graph was recorded with
    replays = act(captured, name, obs, draws=4, seed=None)
    assert any(not torch.equal(replays[f"draw {draw}.0"], replays["draw 0.0"]) for draw in (1, 2, 3)), "no new draws"
    assert torch.equal(*(act(captured, name, obs, seed=3)["draw 0.0"] for _ in range(2))), "seeded alike, other draws"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", TWINS)
def test_atari_frames_reach_the_device_unchanged(name, device):
    """make_frames_to_device: the env's own array on the CPU; on a GPU an asynchronous copy that neither the env's next
    step nor the next call can overwrite while in flight (held up here by a spin kernel)."""
    batches = [np.random.default_rng(seed).integers(0, 256, (8, 4, 84, 84), dtype=np.uint8) for seed in range(4)]
    frames_to_device = load_script(name).make_frames_to_device(batches[0].shape, torch.device(device))
    if device == "cpu":
        on_device = frames_to_device(batches[0])
        assert on_device.dtype == torch.uint8 and on_device.device.type == "cpu"
        assert on_device.data_ptr() == batches[0].ctypes.data
        return
    env_frames = batches[0].copy()  # the env's array: each step writes its frames there
    torch.cuda._sleep(10**9)  # about half a second of spinning: the first copy waits behind it
    on_device = [frames_to_device(env_frames)]
    in_flight = not torch.cuda.current_stream().query()
    env_frames[:] = 0
    for frames in batches[1:]:
        env_frames[:] = frames
        on_device.append(frames_to_device(env_frames))
    env_frames[:] = 0
    torch.cuda.synchronize()
    assert in_flight, "frames_to_device waited for the device: its copy is not asynchronous, the test proves nothing"
    for copied, frames in zip(on_device, batches, strict=True):
        assert copied.dtype == torch.uint8 and copied.device.type == "cuda"
        assert torch.equal(copied.cpu(), torch.from_numpy(frames))


BAD_INPUTS = {
    "unknown-env": (("--env-id", "NoSuchGame-v5"), ("NoSuchGame-v5",)),
    "not-atari": (("--env-id", "CartPole-v1"), ("CartPole-v1", "Atari")),
    "minibatches": (("--num-envs", "2", "--num-steps", "32", "--num-minibatches", "3"), ("num-minibatches", "64")),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
@pytest.mark.parametrize("name", PLAINS + TWINS)
def test_bad_input_exits_2_with_one_clear_line(name, case, tmp_path, capsys):
    check_bad_input_in_process(name, *BAD_INPUTS[case], tmp_path, capsys)


# (flags, seed): Asterix (3 lives, rewards of 50+) runs that finish 3+ games and lose lives in the last rollout.
RUNS = {
    "ppo": (("--env-id", "Asterix-v5", "--num-envs", "2", "--num-steps", "128", "--total-timesteps", "1536",
             "--num-minibatches", "2", "--update-epochs", "1"), 1),
    "pqn": (("--env-id", "Asterix-v5", "--num-envs", "4", "--num-steps", "64", "--total-timesteps", "1280",
             "--num-minibatches", "2", "--update-epochs", "1", "--end-e", "0.5", "--exploration-fraction", "1"), 2),
}  # fmt: skip


@pytest.fixture(scope="module")
def recorded_run():
    """recorded_run(name, seed=its RUNS seed): (globals, envpool steps) of a run of its RUNS flags, made once."""
    record = recorded_runs(())

    def run(name, seed=None):
        flags, default_seed = RUNS[algo(name)]
        return record(name, default_seed if seed is None else seed, flags=flags)

    return run


def run_network(run_globals):
    return built(run_globals["pqn"], "qnet") if "pqn" in run_globals else built(run_globals["ppo"], "agent")


@pytest.mark.parametrize("name", [PPO, PPO_TWIN, PQN, PQN_TWIN])
def test_reported_returns_are_real_game_returns_and_reset_steps_masked(name, recorded_run):
    """episode_returns holds whole games' unclipped returns; the last rollout masks out the reset steps alone."""
    run_globals, steps = recorded_run(name)
    game_returns = episode_sums(steps, "game_reward", ("game_over", "truncated"))
    clipped_returns = episode_sums(steps, "clipped_reward", ("game_over", "truncated"))
    per_life_returns = episode_sums(steps, "game_reward", ("life_lost", "truncated"))
    assert len(game_returns) >= 3, game_returns
    assert clipped_returns != game_returns and len(per_life_returns) > len(game_returns), "the test proves nothing"
    assert run_globals["episode_returns"] == game_returns
    assert all(isinstance(value, float) for value in game_returns)

    flags = RUNS[algo(name)][0]
    num_steps = int(flags[flags.index("--num-steps") + 1])
    ended = np.stack([step["life_lost"] | step["truncated"] for step in steps]).astype(np.float32)
    expected_mask = 1.0 - ended[-num_steps - 1 : -1]  # step k is a reset step when step k - 1 ended an episode
    mask = run_globals["rollout"]["mask"] if is_twin(name) else run_globals["b_mask"].reshape(num_steps, -1)
    assert (expected_mask == 0).sum() >= 1, "no episode ended in the last rollout: the test proves nothing"
    np.testing.assert_array_equal(mask.numpy(), expected_mask)


@pytest.mark.parametrize("plain", [PPO, PQN])
def test_twin_run_matches_plain_run(plain, recorded_run):
    """Same seed and flags: the twin plays the plain script's games step for step (another seed, other games) and ends
    with its parameters within float32 rounding."""
    twin, seed = f"{plain}_torchcompile", RUNS[algo(plain)][1]
    (plain_globals, plain_steps), (twin_globals, twin_steps) = recorded_run(plain), recorded_run(twin)
    assert twin_globals["episode_returns"] == plain_globals["episode_returns"]
    for plain_step, twin_step in zip(plain_steps, twin_steps, strict=True):
        np.testing.assert_array_equal(twin_step["game_reward"], plain_step["game_reward"])
    assert recorded_run(twin, seed + 1)[0]["episode_returns"] != twin_globals["episode_returns"]
    args, iterations = plain_globals["args"], plain_globals["num_iterations"]
    assert args.anneal_lr
    lrs = [(1 - i / iterations) * args.learning_rate for i in range(iterations)]
    # RAdam's first steps are momentum SGD steps of lr times the gradient: allowed as 10 lr each.
    lrs = [lr * (10 if plain == PQN else 1) for lr in lrs for _ in range(args.update_epochs * args.num_minibatches)]
    assert_params_close_after_steps(run_network(twin_globals), run_network(plain_globals), lrs, "end parameters")
    assert_changed(params(build(plain, seed=seed)), run_network(plain_globals).state_dict(), "plain parameters")


@pytest.mark.parametrize("name", [DISTRIBUTED, DISTRIBUTED_TWIN])
def test_world_of_one_is_the_single_process_script(name, recorded_run):
    """A plainly launched distributed script is the single-process run bit for bit: games, parameters, Adam's state."""
    single, world = recorded_run(name.replace("_distributed", ""))[0], recorded_run(name)[0]
    assert world["episode_returns"] == single["episode_returns"]
    assert_same_state(run_network(world).state_dict(), run_network(single).state_dict(), "final parameters")
    assert_same_state(world["ppo"].optimizer.state_dict()["state"], single["ppo"].optimizer.state_dict()["state"],
                      "Adam's state")  # fmt: skip


TINY_FLAGS = ("--env-id", "Breakout-v5", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "1",
              "--update-epochs", "1")  # fmt: skip
BATCH_STEPS = 32


@pytest.mark.parametrize("name", PLAINS + TWINS)
def test_resume_continues_the_run_and_its_schedules(name, tmp_path, saved_checkpoints, monkeypatch):
    """4 iterations saved after 2 and resumed end as the uninterrupted run: counts, annealed lr, PQN's epsilons (the
    schedules set by --total-timesteps); a world of one saves its world size and no other rank's generators."""
    made = []
    monkeypatch.setattr(envpool, "make", recording_make(made, {PQN: "epsilon", PQN_TWIN: "epsilon_tensor"}.get(name)))
    flags = (*TINY_FLAGS, *(("--exploration-fraction", "1") if algo(name) == "pqn" else ()))
    resumed = check_resume_continues_the_run(name, flags, tmp_path, saved_checkpoints, steps=2 * BATCH_STEPS,
                                             same_as_shorter_run=False)  # fmt: skip
    mid, full = saved_checkpoints[:2]
    assert (mid["iteration"], full["iteration"], resumed["iteration"]) == (2, 4, 4)
    lrs = [checkpoint["agent"]["optimizer"]["param_groups"][0]["lr"] for checkpoint in (mid, full, resumed)]
    learning_rate = load_script(name).Args.learning_rate
    assert lrs[:2] == pytest.approx([0.75 * learning_rate, 0.25 * learning_rate]) and lrs[2] == lrs[1]
    if algo(name) == "pqn":
        uninterrupted, resumed_half = ([step["epsilon"] for step in envs.steps] for envs in made[:2])
        assert len(uninterrupted) == 2 * len(resumed_half) == 64 and resumed_half == uninterrupted[32:]
        assert len(set(resumed_half)) == 32, "epsilon does not fall after the checkpoint: the check proves little"
    if "distributed" in name:
        assert resumed["world_size"] == 1 and resumed["rank_rngs"] == []


class RecordingEvalEnvs(RecordingEnvs):
    """RecordingEnvs that also keeps the newest frame of each reset's observation."""

    def __init__(self, envs):
        super().__init__(envs)
        self.reset_frames = []

    def reset(self, *args, **kwargs):
        obs, info = self._envs.reset(*args, **kwargs)
        self.reset_frames.append(obs[0, -1].copy())
        return obs, info


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
    run_in_process(PPO_TWIN, *TINY_FLAGS, "--total-timesteps", BATCH_STEPS, "--save-model", "--model-path",
                   tmp_path / "run" / "agent.pt", "--eval-episodes", "2", "--capture-video",
                   "--results-path", results)  # fmt: skip
    eval_envs = made[-1]
    assert eval_envs.spec.config.num_envs == 1 and eval_envs.spec.config.seed == 1 + 10_000
    ends = [i for i, step in enumerate(eval_envs.steps) if step["game_over"][0] or step["truncated"][0]]
    games = [eval_envs.steps[start + 1 : end + 1] for start, end in zip([-1, *ends[:-1]], ends, strict=True)]
    assert len(games) == 2 and len(eval_envs.reset_frames) == 2, "two games, each from a reset"
    videos = sorted((tmp_path / "run" / "videos").glob("*.mp4"))
    assert [video.name for video in videos] == ["eval-episode-0.mp4", "eval-episode-1.mp4"]
    for video, game, first_frame in zip(videos, games, eval_envs.reset_frames, strict=True):
        frames = iio.imread(video)
        assert frames.shape == (len(game), 84, 84, 3), (frames.shape, len(game))
        # Grey: the channels agree; the first frame is the game's first observation (up to the codec's losses).
        assert (frames[..., 0] == frames[..., 1]).all() and (frames[..., 0] == frames[..., 2]).all()
        assert np.abs(frames[0, ..., 0].astype(float) - first_frame).mean() < 3, "not the observation's newest frame"
        assert frames.max() > 0
    game_returns = [sum(float(step["game_reward"][0]) for step in game) for game in games]
    assert read_results(results)[0]["eval_return"] == pytest.approx(np.mean(game_returns))
