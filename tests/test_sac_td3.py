"""Tests of the SAC and TD3 pairs (leanrl/sac_continuous_action.py, td3_continuous_action.py and their twins),
off-policy actor-critics with a Q ensemble of two; each test over both algorithms but that of TD3's noise."""

import math

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
    check_bf16_layers_of_sac_td3_networks,
    check_bf16_td_errors_near_fp32_at_large_q_values,
    check_learns_pendulum,
    check_off_policy_bf16_update_is_fp32_within_rounding,
    detached,
    leaves,
    named_tensors,
    off_policy_compiled_calls,
    random_batch,
    sync_,
)
from helpers import DEVICES, expose, load_script, requires_cuda
from tensordict import TensorDict

ALGOS = ("sac", "td3")
PLAIN = {"sac": "sac_continuous_action", "td3": "td3_continuous_action"}
TWIN = {algo: f"{plain}_torchcompile" for algo, plain in PLAIN.items()}

OBS_DIM, ACTION_DIM, BATCH = 17, 6, 64
# Asymmetric bounds of different widths: a wrong action_scale, action_bias or clamp shows up.
LOW = np.array([-2.0, -1.0, -1.0, 0.0, -0.5, -1.0], dtype=np.float32)
HIGH = np.array([2.0, 1.0, 0.5, 1.0, 0.5, 3.0], dtype=np.float32)


def build(module, device="cpu", seed=0, **arg_overrides):
    """An agent of any of the four scripts on `device`: its Args as `.args`, its networks as attributes
    (helpers.expose), `.targets` the names of its exposed target networks' parameters (the twin's alone)."""
    torch.manual_seed(seed)
    args = module.Args(**arg_overrides)
    sac = hasattr(args, "autotune")
    agent = (module.build_sac if sac else module.build_td3)(OBS_DIM, ACTION_DIM, LOW, HIGH, args, torch.device(device))
    agent.args, agent.targets = args, ()
    if hasattr(args, "compile"):
        agent.targets = ("target_qnet_params",) if sac else ("target_qnet_params", "target_actor_params")
        return expose(agent, "actor", "qnet_params", *agent.targets)
    return expose(agent, "actor", "qf1", "qf2")


def actor_params(agent):
    """The parameters of the actor update: the actor's, and SAC's log_alpha (its entropy coefficient)."""
    log_alpha = {"log_alpha": agent.log_alpha} if hasattr(agent, "log_alpha") else {}
    return {**dict(agent.actor.named_parameters()), **log_alpha}


def q_params(agent):
    """The twin's stacked Q networks; the plain agent's two Q networks stacked alike (copies, their gradients too)."""
    if hasattr(agent, "qnet_params"):
        return agent.qnet_params
    stacked = {}
    for (name, first), (_, second) in zip(agent.qf1.named_parameters(), agent.qf2.named_parameters(), strict=True):
        stacked[name] = torch.stack([first.detach(), second.detach()])
        stacked[name].grad = torch.stack([first.grad, second.grad])
    return stacked


def learning_rates(agent):
    """The critic update's learning rate, and the actor update's (SAC's log_alpha steps at the critic's)."""
    args = agent.args
    if hasattr(args, "q_lr"):
        return args.q_lr, {name: args.q_lr if name == "log_alpha" else args.policy_lr for name in actor_params(agent)}
    return args.learning_rate, args.learning_rate


def snapshot(agent):
    actor = {name: value.detach().clone() for name, value in actor_params(agent).items()}
    return {"qnet": leaves(agent.qnet_params.data), "actor": actor} | {
        group: leaves(getattr(agent, group)) for group in agent.targets
    }


# --- 1. Learning ----------------------------------------------------------------------------------------------
#
# The plain script on one env; the twin with --compile on 4 envs with 4 gradient steps an iteration (as many updates
# as one env makes), saved at half its budget and resumed. The mean of 10 consecutive episodes (of the resumed half,
# for the twin) must pass -300 within the budget (batches under the default 256 cost less; 256: docs/curves/).
# Seeds 1 and 2 pass (2-core AMD EPYC VM, 1 thread): SAC (batch 64) at episode 25 of 30, the resumed twin at the 10th
# after the resume; TD3 (batch 128; seed 2 only just crossed at 64) at episode 38 of 65, the resumed twin at the 10th
# and 17th of 36 (TD3 dips after first solving the task: the 10 episodes may lie anywhere in the resumed half).
LEARNING = {"sac": (64, {False: 6000, True: 8000}), "td3": (128, {False: 13000, True: 15000})}  # batch, steps
LEARNING_THRESHOLD = -300.0  # random policy: about -1200 on Pendulum-v1; a solved one: about -150


@pytest.mark.parametrize("twin", [False, True], ids=["plain", "twin-compile-4-envs-resumed-half-way"])
@pytest.mark.parametrize("algo", ALGOS)
def test_learns_pendulum(algo, twin, tmp_path):
    batch_size, steps = LEARNING[algo]
    flags = ("--seed", 1, "--learning-starts", 1000, "--batch-size", batch_size)
    if twin:
        flags += ("--compile", "--num-envs", "4", "--gradient-steps", "4")
    name = TWIN[algo] if twin else PLAIN[algo]
    check_learns_pendulum(name, flags, steps[twin], 4 if twin else 1, twin, tmp_path, LEARNING_THRESHOLD)


# --- 2. TD3's policy: Gaussian exploration noise scaled to the action range, clipped to the bounds ---------------


@pytest.mark.parametrize("name", [PLAIN["td3"], TWIN["td3"]])
def test_td3_policy_adds_scaled_noise_and_stays_in_bounds(name):
    module = load_script(name)
    td3 = build(module)
    obs = torch.randn(1, OBS_DIM, generator=torch.Generator().manual_seed(7)).expand(4096, OBS_DIM)
    scale = torch.as_tensor((HIGH - LOW) / 2)
    with torch.no_grad():
        greedy = td3.actor(obs[:1])
    # The untrained actor's actions sit several noise deviations inside the bounds: no sample is clipped here.
    noise = td3.policy(obs) - greedy
    torch.testing.assert_close(noise.mean(0), torch.zeros(ACTION_DIM), rtol=0, atol=0.02)
    torch.testing.assert_close(noise.std(0), 0.1 * scale, rtol=0.1, atol=0)

    # With huge noise, every action dimension is clipped to both of its bounds.
    actions = build(module, exploration_noise=100.0).policy(obs)
    low, high = torch.as_tensor(LOW), torch.as_tensor(HIGH)
    assert ((actions >= low) & (actions <= high)).all(), "actions leave the action bounds"
    assert (actions == low).any(0).all() and (actions == high).any(0).all(), "actions are not clipped to the bounds"


# --- 3. The updates and the policy agree: compiled and eager twin, captured and not, twin and plain -------------


def check_round(reference, others, batch, seed, checks, what, grads=True):
    """A critic, an actor and a target update of agents from the same parameters, seeded alike: each of the others
    (twins) compared with the reference and re-synced to it (checks[i]: others[i]'s {group: SameUpdates}); the twins'
    targets with the first twin's (the plain agent's enter the next critic loss). grads: as in SameUpdates."""
    q_lr, actor_lr = learning_rates(reference)
    phases = (("update_critic", q_params, q_lr, "Q update"), ("update_actor", actor_params, actor_lr, "actor update"))
    losses = {}
    for offset, (update, params, lr, group) in enumerate(phases):
        sides = []
        for agent in (reference, *others):
            torch.manual_seed(seed + offset)
            sides.append(detached(getattr(agent, update)(batch)))
        for index, other in enumerate(others):
            assert_leaves_close(sides[index + 1], sides[0], f"{what} {update} losses")
            checks[index].setdefault(group, SameUpdates(group)).check(params(other), params(reference), lr, what, grads)
        losses |= sides[0]
    assert {"qf_loss", "qf1_values", "actor_loss"} <= losses.keys(), losses.keys()

    twins = [agent for agent in (reference, *others) if agent.targets]
    for agent in (reference, *others):
        agent.update_targets()
    for twin in twins[1:]:
        for group in twin.targets:
            expected = getattr(twins[0], group)
            assert_leaves_close(leaves(getattr(twin, group)), leaves(expected), f"{what} {group}")
            sync_(getattr(twin, group), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algo", ALGOS)
def test_twin_eager_and_compiled_updates_and_policy_match_plain(algo, device, inductor_fallback_random):
    """Same start, same batches, same noise: the twin's updates and policy, eager and compiled, compute what the plain
    script's do, in several rounds (Adam's moments and step count, and the targets, take part). TD3 with more target
    smoothing noise than its default: the noise clip and the clamp to the action bounds both act."""
    noise = dict(policy_noise=1.0, noise_clip=0.8) if algo == "td3" else {}
    module = load_script(TWIN[algo])
    plain = build(load_script(PLAIN[algo]), device, **noise)
    twins = build(module, device, **noise), build(module, device, compile=True, **noise)

    def plain_qnet():  # stacked like the twin's ensemble (a copy)
        return torch.stack([TensorDict.from_module(plain.qf1).data, TensorDict.from_module(plain.qf2).data]).clone()

    start = plain_qnet()
    for twin in twins:  # the plain agent's networks; the targets start as copies of the networks in both
        sync_(actor_params(twin), actor_params(plain))
        sync_(twin.qnet_params, start)
        sync_(twin.target_qnet_params, start)
        if algo == "td3":
            sync_(twin.target_actor_params, TensorDict.from_module(plain.actor).data)
    twin_start = snapshot(twins[0])

    low, high = torch.as_tensor(LOW, device=device), torch.as_tensor(HIGH, device=device)
    for num_envs in (1, 16):  # the observations of one env, or of many at once (--num-envs)
        obs = torch.randn(num_envs, OBS_DIM, generator=torch.Generator().manual_seed(7)).to(device)
        actions = []
        for agent in (plain, *twins):
            torch.manual_seed(42)
            actions.append(torch.stack([agent.policy(obs) for _ in range(2)]))
        assert actions[0].shape == (2, num_envs, ACTION_DIM)
        for twin_actions in actions[1:]:
            torch.testing.assert_close(twin_actions, actions[0], rtol=RTOL, atol=ATOL)
        assert not torch.equal(actions[0][0], actions[0][1]), "the policy does not explore"
        assert ((actions[0] >= low) & (actions[0] <= high)).all(), "actions leave the action bounds"

    checks = [{}, {}]
    for round_ in range(3):
        batch = random_batch(BATCH, OBS_DIM, ACTION_DIM, seed=123 + round_, device=device)
        check_round(plain, twins, batch, 1000 + 10 * round_, checks, f"round {round_}")
    assert_changed(leaves(start), leaves(plain_qnet()), "plain Q networks")
    end = snapshot(twins[0])
    for group in twin_start:
        assert_changed(twin_start[group], end[group], f"eager twin's {group}")


@requires_cuda
@pytest.mark.parametrize("algo", ALGOS)
def test_twin_captured_updates_and_policy_match_uncaptured(algo, inductor_fallback_random):
    """CudaGraphModule(warmup=5): calls 1-4 run eagerly on a side stream, call 5 runs once and records the graph,
    calls 6-8 replay it. Each call is compared with the uncaptured compiled twin's; before call 7 other values are
    written in place into every tensor the graphs read (the networks, the targets, SAC's log_alpha): the replays
    follow."""
    module = load_script(TWIN[algo])
    uncaptured = build(module, "cuda", compile=True)
    captured = build(module, "cuda", compile=True, cudagraphs=True)
    for group, tensors in snapshot(captured).items():
        assert_leaves_close(tensors, snapshot(uncaptured)[group], f"initial {group}", rtol=0, atol=0)

    checks = [{}]
    for call in range(1, 9):
        if call == 7:
            others = build(module, "cuda", seed=1)  # other networks, and (SAC) another entropy coefficient
            if algo == "sac":
                with torch.no_grad():
                    others.log_alpha.fill_(math.log(0.5))
            for agent in (uncaptured, captured):
                for group in ("qnet_params", *agent.targets):
                    sync_(getattr(agent, group), getattr(others, group))
                sync_(actor_params(agent), actor_params(others))
        batch = random_batch(BATCH, OBS_DIM, ACTION_DIM, seed=call, device="cuda")
        check_round(uncaptured, (captured,), batch, 100 * call, checks, f"call {call}", grads=call != 5)

        obs = torch.randn(3, OBS_DIM, generator=torch.Generator().manual_seed(call)).to("cuda")
        actions = {}
        for label, agent in (("uncaptured", uncaptured), ("captured", captured)):
            torch.manual_seed(100 * call + 2)  # the policy's noise
            actions[label] = agent.policy(obs)
        torch.testing.assert_close(actions["captured"], actions["uncaptured"], rtol=RTOL, atol=ATOL)
    assert captured.update_critic.counter == captured.update_actor.counter == captured.policy.counter == 5, (
        "the updates and the policy were not captured"
    )


@requires_cuda
@pytest.mark.parametrize("algo", ALGOS)
def test_twin_captured_random_numbers_change_between_replays(algo):
    """The twin as a run with --compile --cudagraphs uses it (inductor's own random numbers): after the capture, each
    replay draws new noise (the policy's; the critic's next actions (SAC) or target smoothing (TD3); SAC's actor's
    actions); seeded alike from identical parameters, two replays agree."""
    agent = build(load_script(TWIN[algo]), "cuda", compile=True, cudagraphs=True)
    batch = random_batch(BATCH, OBS_DIM, ACTION_DIM, seed=5, device="cuda")
    obs = torch.randn(1, OBS_DIM, generator=torch.Generator().manual_seed(7)).to("cuda")
    for _ in range(6):  # the 5th call records the graphs, the 6th replays them
        agent.update_critic(batch)
        agent.update_actor(batch)
        agent.policy(obs)
    assert agent.update_critic.counter == agent.update_actor.counter == agent.policy.counter == 5

    first, second = agent.policy(obs), agent.policy(obs)
    assert not torch.equal(first, second), "two replays of the policy drew the same noise"
    replays = []
    for _ in range(2):
        torch.manual_seed(3)
        replays.append(agent.policy(obs))
    torch.testing.assert_close(replays[1], replays[0], rtol=0, atol=0)

    # The losses come before the optimizer step: from the same parameters, they depend on the noise alone.
    def replay(update, params, saved, seed, key):
        sync_(params, saved)
        torch.manual_seed(seed)
        return update(batch)[key].clone()

    noisy = [(agent.update_critic, agent.qnet_params, "qf_loss")]
    if algo == "sac":  # log_pi's noise (not alpha's loss through alpha, which moves)
        noisy.append((agent.update_actor, actor_params(agent), "alpha_loss"))
    for update, params, key in noisy:
        saved = {name: value.detach().clone() for name, value in named_tensors(params).items()}
        seed_1, seed_2, seed_1_again = (replay(update, params, saved, seed, key) for seed in (1, 2, 1))
        assert not torch.allclose(seed_2, seed_1, rtol=RTOL, atol=ATOL), f"{key}: another seed, the same noise"
        torch.testing.assert_close(seed_1_again, seed_1, rtol=RTOL, atol=ATOL, msg=f"{key}: same seed, other noise")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algo", ALGOS)
def test_twin_bf16_updates_and_policy_are_fp32_within_rounding(algo, device, inductor_fallback_random):
    """--bf16: the hidden layers in bf16, the heads, targets and losses in fp32 (checks.py for the tolerance)."""
    module = load_script(TWIN[algo])
    build_ = lambda **overrides: build(module, device, **overrides)  # noqa: E731
    check_off_policy_bf16_update_is_fp32_within_rounding(build_, OBS_DIM, ACTION_DIM, device)


@pytest.mark.parametrize(
    ("algo", "q_network", "lr"), [("sac", "SoftQNetwork", "q_lr"), ("td3", "QNetwork", "learning_rate")]
)
def test_twin_bf16_fp32_layers_keep_td_errors_at_large_q_values(algo, q_network, lr, monkeypatch):
    """--bf16: the first and last layers in fp32 (the hidden one in bf16), so the TD errors are fp32's."""
    module = load_script(TWIN[algo])
    check_bf16_layers_of_sac_td3_networks(module, q_network, OBS_DIM, ACTION_DIM)
    build_ = lambda **overrides: build(module, **{lr: 0.0}, **overrides)  # noqa: E731
    check_bf16_td_errors_near_fp32_at_large_q_values(build_, OBS_DIM, ACTION_DIM, monkeypatch)


@pytest.mark.parametrize("algo", ALGOS)
def test_twin_built_again_computes_with_its_own_hyperparameters(algo, inductor_fallback_random):
    compiled_calls = off_policy_compiled_calls(build, snapshot, OBS_DIM, ACTION_DIM, BATCH)
    check_a_second_build_computes_with_its_own_hyperparameters(TWIN[algo], compiled_calls)


# Flags, bad input, determinism, results, checkpoints, video, signals: test_scripts.py; resuming: test_num_envs.py.
