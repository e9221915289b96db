"""Tests of the PQN Atari pair: leanrl/pqn_atari_envpool.py (plain) and its twin pqn_atari_envpool_torchcompile.py.

Everything goes through the scripts' stable interface: Args, compute_q_lambda_returns, epsilon_greedy, build_pqn and
the namespace it returns, the command line, the globals of a run (`episode_returns`, the last rollout), the
--results-path JSON line, checkpoints and exit statuses. The plain script stores frames as float32, the twin as
uint8: both divide by 255 in the network. No test here shows the agent learning: a Breakout run shows it after 100k to
200k steps (docs/pqn_atari.md: a mean score of 2.4 at 100k and 4.2 at 200k, a random policy's being 1.58), 9 to 18
minutes of a 2-core CPU, past the suite's budget. What is tested of it is the update's part: it moves every Q value
toward its target.
"""

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
    check_a_second_build_computes_with_its_own_hyperparameters,
    check_bad_input_in_process,
    check_bf16_update_is_fp32_within_rounding,
    check_resume_continues_the_run,
    detached,
    flat,
)
from helpers import (
    DEVICES,
    built,
    default_dtype,
    episode_sums,
    expose,
    load_script,
    one_torch_thread,
    recorded_runs,
    recording_make,
    requires_cuda,
)
from tensordict import TensorDict

PLAIN = "pqn_atari_envpool"
TWIN = "pqn_atari_envpool_torchcompile"
SCRIPTS = (PLAIN, TWIN)
NUM_ACTIONS, BATCH = 4, 64
LOSS_NAMES = {"td_loss", "q_values"}
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # the CNN's OpenMP threads wait for one another on a small shared machine


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def build(module, device="cpu", seed=0, **arg_overrides):
    """An agent of either script on `device`, its Q networks as attributes (helpers.expose)."""
    torch.manual_seed(seed)
    args = module.Args(**arg_overrides)
    pqn = module.build_pqn(NUM_ACTIONS, args, torch.device(device))
    return expose(pqn, "qnet", *(("acting_qnet",) if hasattr(args, "compile") else ()))


def params(pqn):
    return {name: value.detach().clone() for name, value in built(pqn, "qnet").state_dict().items()}


def random_minibatch(seed, size=BATCH, masked_fraction=0.25, device="cpu"):
    """A minibatch of random Atari frames (uint8), actions and returns, some steps masked out (reset steps)."""
    generator = torch.Generator().manual_seed(seed)
    batch = dict(
        obs=torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8, generator=generator),
        actions=torch.randint(0, NUM_ACTIONS, (size,), generator=generator),
        returns=torch.randn(size, generator=generator),
        mask=(torch.rand(size, generator=generator) >= masked_fraction).float(),
    )
    return {key: value.to(device) for key, value in batch.items()}


def call_update(pqn, name, batch):
    """The plain script's update takes the minibatch's tensors (float32 frames), the twin's a TensorDict of them
    (uint8 frames in channels-last order, as its loop gives them)."""
    if name == PLAIN:
        return pqn.update(batch["obs"].float(), batch["actions"], batch["returns"], batch["mask"])
    obs = batch["obs"].contiguous(memory_format=torch.channels_last)
    return pqn.update(TensorDict(dict(batch, obs=obs), batch_size=[len(batch["obs"])]))


def q_of_actions(pqn, obs, actions):
    with torch.no_grad():
        return pqn.qnet(obs.float()).gather(1, actions[:, None])[:, 0]


# --- 1. The update: it moves each Q value toward its target; reset steps are masked out ----------------------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_updates_move_every_q_value_toward_its_target(name):
    """Four updates on one batch whose targets lie above Q(s, a) for actions 0 and 1 and below it for 2 and 3: every
    Q(s, a) moves toward its target and the loss falls. (The sign is tied to the action so that a few small steps
    can follow it for every sample, not only on average; the twin's compiled update is shown equal to this one.) Not a
    learning test: the module's docstring says why there is none."""
    module = load_script(name)
    pqn = build(module, learning_rate=1e-3)
    batch = random_minibatch(seed=5, masked_fraction=0.0)
    before = q_of_actions(pqn, batch["obs"], batch["actions"])
    offsets = torch.where(batch["actions"] < 2, 1.0, -1.0) * (
        0.5 + torch.rand(BATCH, generator=torch.Generator().manual_seed(6))
    )
    batch["returns"] = before + offsets
    losses = [detached(call_update(pqn, name, batch)) for _ in range(4)]
    assert set(losses[0]) == LOSS_NAMES
    after = q_of_actions(pqn, batch["obs"], batch["actions"])
    moved = (after - before) * offsets.sign()
    print(f"{name}: mean move toward the target {moved.mean():.4f}, td_loss {losses[0]['td_loss']:.4f} -> "
          f"{losses[-1]['td_loss']:.4f}")  # fmt: skip
    assert (moved > 0).all(), f"Q values that moved away from their targets: {moved[moved <= 0]}"
    assert (
        losses[-1]["td_loss"] < losses[0]["td_loss"]
        and ((after - batch["returns"]) ** 2).mean() < losses[-1]["td_loss"]
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_masked_steps_do_not_change_the_update(name):
    """The update of a minibatch with masked steps (mask 0: envpool's reset steps) is, by definition, the update of its
    other steps alone: the loss is the mean over those, and so are the gradients. Four agents from one start, two
    rounds of updates each: the masked minibatch; the same with other data in its masked steps; its unmasked steps
    alone, with nothing masked; and the second one with nothing masked, which must differ from the first."""
    module = load_script(name)
    batch = random_minibatch(seed=11)
    masked = batch["mask"] == 0
    assert 0 < masked.sum() < BATCH
    noise = random_minibatch(seed=12)
    other = dict(batch)
    for key in ("obs", "actions", "returns"):
        other[key] = torch.where(masked.view(-1, *[1] * (batch[key].dim() - 1)), noise[key], batch[key])
    kept = {key: value[~masked] for key, value in batch.items()}
    minibatches = {"masked": batch, "other data masked": other, "unmasked steps alone": kept,
                   "other data unmasked": dict(other, mask=torch.ones(BATCH))}  # fmt: skip
    assert (kept["mask"] == 1).all()
    agents = {label: build(module) for label in minibatches}
    for round_ in range(2):
        losses = {label: detached(call_update(agents[label], name, data)) for label, data in minibatches.items()}
        for label in ("other data masked", "unmasked steps alone"):
            assert_leaves_close(losses[label], losses["masked"], f"round {round_}, {label}: losses")
            assert_leaves_close(params(agents[label]), params(agents["masked"]), f"round {round_}, {label}: parameters")
        assert_changed(params(agents["other data unmasked"]), params(agents["masked"]), f"round {round_}: unmasking")


# --- 2. Q(lambda) returns and epsilon-greedy ------------------------------------------------------------------------


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


def random_rollout(num_steps, num_envs, seed):
    generator = torch.Generator().manual_seed(seed)
    return dict(
        rewards=torch.randn(num_steps, num_envs, generator=generator),
        values=torch.randn(num_steps, num_envs, generator=generator),
        dones=(torch.rand(num_steps, num_envs, generator=generator) < 0.1).float(),
        next_value=torch.randn(num_envs, generator=generator),
        next_done=torch.tensor([1.0] + [0.0] * (num_envs - 1)),
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_q_lambda_returns_match_the_definition(name):
    """The plain loop and the twin's parallel scan (its compiled form is compared with it below)."""
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
    module = load_script(PLAIN)
    q_values = torch.randn(40_000, NUM_ACTIONS, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert torch.equal(module.epsilon_greedy(q_values, 0.0), q_values.argmax(1))
    counts = torch.bincount(module.epsilon_greedy(q_values, 1.0), minlength=NUM_ACTIONS) / len(q_values)
    torch.testing.assert_close(counts, torch.full((NUM_ACTIONS,), 1 / NUM_ACTIONS), rtol=0, atol=0.01)
    not_greedy = (module.epsilon_greedy(q_values, 0.25) != q_values.argmax(1)).float().mean()
    assert abs(not_greedy - 0.25 * 3 / 4) < 0.01, not_greedy


# --- 3. The twin computes what the plain script does; compiled and eager agree -------------------------------------


def learning_rate(pqn):
    return float(pqn.optimizer.param_groups[0]["lr"])


@pytest.mark.parametrize("device", DEVICES)
def test_twin_eager_matches_plain(device):
    """Same start, same minibatches, same learning-rate schedule: the twin's updates compute the plain script's; its
    acting copy sees them, and its policy draws the same actions from the same seed."""
    plain, twin = build(load_script(PLAIN), device), build(load_script(TWIN), device)
    assert_leaves_close(params(twin), params(plain), "initial parameters", rtol=0, atol=0)
    start = params(plain)
    check = SameUpdates("update")
    for round_ in range(3):
        batch = random_minibatch(seed=200 + round_, device=device)
        plain_losses, twin_losses = detached(call_update(plain, PLAIN, batch)), detached(call_update(twin, TWIN, batch))
        assert_leaves_close(twin_losses, plain_losses, f"round {round_} losses")
        check.check(twin.qnet, plain.qnet, learning_rate(plain), f"round {round_}")
        plain.set_learning_rate(learning_rate(plain) * 0.5)
        twin.set_learning_rate(learning_rate(twin) * 0.5)
    assert_changed(start, params(plain), "plain parameters")

    obs = random_minibatch(seed=8, size=32, device=device)["obs"]
    outputs = {}
    for label, pqn, frames, epsilon in ((PLAIN, plain, obs.float(), 0.5),
                                        (TWIN, twin, obs, torch.tensor(0.5, device=device))):  # fmt: skip
        torch.manual_seed(3)
        outputs[label] = [*pqn.policy(frames, epsilon), pqn.value(frames)]
    assert torch.equal(outputs[TWIN][0], outputs[PLAIN][0]), "other actions"
    for actual, expected in zip(outputs[TWIN][1:], outputs[PLAIN][1:], strict=True):
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
    for path, parameter in twin.qnet.named_parameters():
        module_path, _, attribute = path.rpartition(".")
        acting = getattr(twin.acting_qnet.get_submodule(module_path), attribute)
        assert acting.data_ptr() == parameter.data_ptr() and not acting.requires_grad, path


@pytest.mark.parametrize("device", DEVICES)
def test_twin_bf16_update_and_values_are_fp32_within_rounding(device):
    module = load_script(TWIN)
    check_bf16_update_is_fp32_within_rounding(
        lambda **overrides: build(module, device, **overrides),
        lambda pqn, batch: call_update(pqn, TWIN, batch),
        lambda pqn: pqn.qnet,
        [random_minibatch(seed=500, device=device), random_minibatch(seed=501, device=device)],
        lambda pqn, obs: pqn.value(obs),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_twin_compiled_matches_eager(device, inductor_fallback_random):
    """The compiled update (forward and backward in one graph), policy, value and Q(lambda) returns compute the
    eager twin's, round after round, with the learning rate annealed in place between rounds."""
    # On CUDA in float64: in float32 the compiled and eager gradients of the first conv layer were up to 3.5% of their
    # largest entry apart in the second round (an H200, torch 2.11); in float64 every round matched. So that gap is
    # rounding, not another computation, which would differ at either precision.
    with default_dtype(torch.float64 if device == "cuda" else torch.float32):
        module = load_script(TWIN)
        eager, compiled = build(module, device, compile=False), build(module, device, compile=True)
        check = SameUpdates("update")
        for round_ in range(3):
            batch = random_minibatch(seed=100 + round_, device=device)
            losses = {
                label: detached(call_update(pqn, TWIN, batch))
                for label, pqn in (("eager", eager), ("compiled", compiled))
            }
            assert_leaves_close(losses["compiled"], losses["eager"], f"round {round_} losses")
            check.check(compiled.qnet, eager.qnet, learning_rate(eager), f"round {round_}")
            for pqn in (eager, compiled):
                pqn.set_learning_rate(learning_rate(pqn) * 0.5)
        # The shapes of a run of 2 envs x 32 steps (the flag-combination test's): its compiles hit this one's cache.
        obs = random_minibatch(seed=7, size=2, device=device)["obs"]
        epsilon = torch.tensor(0.5, device=device)
        outputs = {}
        for label, pqn in (("eager", eager), ("compiled", compiled)):
            torch.manual_seed(42)
            calls = [pqn.policy(obs, epsilon) for _ in range(8)]
            outputs[label] = [torch.stack([action for action, _ in calls]), calls[-1][1], pqn.value(obs)]
        assert torch.equal(outputs["compiled"][0], outputs["eager"][0]), "other actions"
        assert len(outputs["eager"][0].unique()) > 1, "the policy does not explore"
        for actual, expected in zip(outputs["compiled"][1:], outputs["eager"][1:], strict=True):
            torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
    rollout = {key: value.to(device) for key, value in random_rollout(32, 2, seed=9).items()}
    expected = reference_q_lambda_returns(**{k: v.cpu() for k, v in rollout.items()}, gamma=0.99, q_lambda=0.65)
    torch.testing.assert_close(eager.q_lambda_returns(**rollout).cpu(), expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(
        compiled.q_lambda_returns(**rollout), eager.q_lambda_returns(**rollout), rtol=RTOL, atol=ATOL
    )


@requires_cuda
def test_twin_captured_matches_uncaptured(inductor_fallback_random):
    """CudaGraphModule(warmup=5): calls 1-4 run on a side stream, call 5 records the graph, the later ones replay it;
    each is compared with the uncaptured compiled twin's. The learning rate and epsilon are tensors written in place
    between calls: the replays follow them."""
    module = load_script(TWIN)
    uncaptured = build(module, "cuda", compile=True)
    captured = build(module, "cuda", compile=True, cudagraphs=True)
    check = SameUpdates("update")
    warmup = 5  # the twin's CudaGraphModule(warmup=5)
    for call in range(1, warmup + 4):
        lr = 2.5e-4 * (1 - call / 10)
        for pqn in (uncaptured, captured):
            pqn.set_learning_rate(lr)
        obs = random_minibatch(seed=1000 + call, size=8, device="cuda")["obs"]
        epsilon = torch.tensor(0.1 * call, device="cuda")
        outputs = {}
        for label, pqn in (("uncaptured", uncaptured), ("captured", captured)):
            torch.manual_seed(100 * call)
            outputs[label] = [*pqn.policy(obs, epsilon), pqn.value(obs)]
        assert torch.equal(outputs["captured"][0], outputs["uncaptured"][0]), f"call {call}: other actions"
        for actual, expected in zip(outputs["captured"][1:], outputs["uncaptured"][1:], strict=True):
            torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
        batch = random_minibatch(seed=call, device="cuda")
        losses = {
            label: detached(call_update(pqn, TWIN, batch))
            for label, pqn in (("uncaptured", uncaptured), ("captured", captured))
        }
        assert_leaves_close(losses["captured"], losses["uncaptured"], f"call {call} losses")
        check.check(captured.qnet, uncaptured.qnet, lr, f"call {call}", grads=call != warmup)
        rollout = {key: value.cuda() for key, value in random_rollout(32, 4, seed=call).items()}
        torch.testing.assert_close(captured.q_lambda_returns(**rollout), uncaptured.q_lambda_returns(**rollout),
                                   rtol=RTOL, atol=ATOL)  # fmt: skip
    for function in ("update", "policy", "value", "q_lambda_returns"):
        assert getattr(captured, function).counter == warmup, f"{function} was not captured"


def test_twin_built_again_computes_with_its_own_hyperparameters(inductor_fallback_random):
    def compiled_calls(module, **overrides):
        pqn = build(module, **overrides)
        batch = random_minibatch(seed=77, size=32)
        torch.manual_seed(8)
        outputs = flat(policy=pqn.policy(batch["obs"], torch.tensor(0.5)), value=pqn.value(batch["obs"]))
        outputs.update(flat(returns=pqn.q_lambda_returns(**random_rollout(16, 4, seed=9))))
        return {**outputs, **flat(losses=call_update(pqn, TWIN, batch), qnet=params(pqn))}

    check_a_second_build_computes_with_its_own_hyperparameters(TWIN, compiled_calls)


# --- 4. Bad input (flags, the results line, checkpoints across the pair, signals: test_scripts.py) ----------------


BAD_INPUTS = {
    "unknown-env": (("--env-id", "NoSuchGame-v5"), ("NoSuchGame-v5",)),
    "mujoco-env": (("--env-id", "HalfCheetah-v5"), ("HalfCheetah-v5", "Atari")),
    "classic-env": (("--env-id", "CartPole-v1"), ("CartPole-v1", "Atari")),
    "minibatches-do-not-divide": (
        ("--num-envs", "2", "--num-steps", "32", "--num-minibatches", "3"),
        ("num-minibatches", "64"),
    ),  # fmt: skip
    "zero-envs": (("--num-envs", "0"), ("num-envs",)),
    "zero-epochs": (("--update-epochs", "0"), ("update-epochs",)),
    "zero-timesteps": (("--total-timesteps", "0"), ("total-timesteps",)),
    "lambda-below-0": (("--q-lambda", "-0.1"), ("q-lambda", "[0, 1]")),
    "lambda-above-1": (("--q-lambda", "1.5"), ("q-lambda", "[0, 1]")),
    "exploration-fraction-0": (("--exploration-fraction", "0"), ("exploration-fraction", "(0, 1]")),
    "exploration-fraction-above-1": (("--exploration-fraction", "1.5"), ("exploration-fraction", "(0, 1]")),
    "epsilon-rises": (("--start-e", "0.1", "--end-e", "0.5"), ("end-e", "start-e")),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
@pytest.mark.parametrize("name", SCRIPTS)
def test_bad_input_exits_2_with_one_clear_line(name, case, tmp_path, capsys):
    flags, expected_words = BAD_INPUTS[case]
    check_bad_input_in_process(name, flags, expected_words, tmp_path, capsys)


# --- 5. Runs: the game's real returns, reset steps, determinism, twin run = plain run ------------------------------

# Asterix: 3 lives, rewards of 50 and more (clipped to 1), games of about 200-350 steps per env under a near-random
# policy (epsilon from 1 to 0.5 over the run). 4 envs x 320 steps: with RUN_SEED, 3 finished games and lives lost in
# the last rollout (seed 1 loses none there).
RUN = ("--env-id", "Asterix-v5", "--num-envs", "4", "--num-steps", "64", "--total-timesteps", "1280",
       "--num-minibatches", "2", "--update-epochs", "1", "--end-e", "0.5", "--exploration-fraction", "1")  # fmt: skip
RUN_SEED = 2


@pytest.fixture(scope="module")
def recorded_run():
    """recorded_run(name, seed, flags=RUN, max_episode_steps=None): (globals, envpool steps) of a run (helpers),
    with the epsilon each step acted with (the twin's policy reads epsilon_tensor, the plain script's epsilon)."""
    return recorded_runs(RUN, lambda name: "epsilon_tensor" if name == TWIN else "epsilon")


@pytest.mark.parametrize("name", SCRIPTS)
def test_reported_returns_are_real_game_returns_and_reset_steps_masked(name, recorded_run):
    """episode_returns holds whole games (all lives) scored with the game's own rewards, not the clipped ones; the
    last rollout masks out envpool's reset steps (the step after an episode's end), and only those."""
    run_globals, steps = recorded_run(name, RUN_SEED)
    game_returns = episode_sums(steps, "game_reward", ("game_over", "truncated"))
    clipped_returns = episode_sums(steps, "clipped_reward", ("game_over", "truncated"))
    per_life_returns = episode_sums(steps, "game_reward", ("life_lost", "truncated"))
    assert len(game_returns) >= 3, game_returns
    assert clipped_returns != game_returns and len(per_life_returns) > len(game_returns), "the test proves nothing"
    assert run_globals["episode_returns"] == game_returns
    assert all(isinstance(value, float) for value in game_returns)

    num_steps = int(RUN[RUN.index("--num-steps") + 1])
    ended = np.stack([step["life_lost"] | step["truncated"] for step in steps]).astype(np.float32)
    expected_mask = 1.0 - ended[-num_steps - 1 : -1]  # step k is a reset step when step k - 1 ended an episode
    mask = run_globals["b_mask"].reshape(num_steps, -1) if name == PLAIN else run_globals["rollout"]["mask"]
    assert (expected_mask == 0).sum() >= 1, "no episode ended in the last rollout: the test proves nothing"
    np.testing.assert_array_equal(mask.numpy(), expected_mask)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_loop_acts_with_epsilon_at_the_step_count_after_each_step(name, recorded_run):
    """CleanRL's order: each env step acts with the rate at the step count it brings the run to (num_envs more than
    before it), so the first step explores a little less than start-e, and the last one of RUN (whose decay, from 1 to
    0.5, lasts the whole run) at end-e."""
    run_globals, steps = recorded_run(name, RUN_SEED)
    num_envs, total = int(RUN[RUN.index("--num-envs") + 1]), int(RUN[RUN.index("--total-timesteps") + 1])
    assert len(steps) == total // num_envs
    expected = [max(0.5, 1 - 0.5 * (k + 1) * num_envs / total) for k in range(len(steps))]
    assert expected[0] == pytest.approx(1 - 0.5 * 4 / 1280) and expected[-1] == 0.5
    assert [step["epsilon"] for step in steps] == pytest.approx(expected, rel=0, abs=1e-6)


# Asterix games cut by a time limit of 100 steps, in the second of two rollouts of 4 envs x 64 steps; under a
# near-random policy the first life is lost after about 65-95 steps: lives lost in that rollout too.
TIME_LIMIT_RUN = (
    *RUN[: RUN.index("--total-timesteps")],
    "--total-timesteps",
    "512",
    *RUN[RUN.index("--num-minibatches") :],
)
TIME_LIMIT = 100


@pytest.mark.parametrize("name", SCRIPTS)
def test_returns_end_at_truncations_as_terminations_and_span_no_reset(name, recorded_run):
    """A truncation (the time limit) ends the return as a termination (a lost life) does, as in CleanRL and the PQN
    paper: the last rollout's Q(lambda) targets are those of their definition, computed from what the envs returned
    (clipped rewards; an episode ends where a life is lost or the time limit cuts the game) and the script's max-Q
    values, every episode end cutting the return; at a step that ends an episode, truncated or not, the target is the
    reward alone, with nothing bootstrapped from the episode's last frame, and no target up to an end depends on what
    comes after it. The step after each end, envpool's reset step, is masked out."""
    run_globals, steps = recorded_run(name, 1, flags=TIME_LIMIT_RUN, max_episode_steps=TIME_LIMIT)
    num_steps = int(TIME_LIMIT_RUN[TIME_LIMIT_RUN.index("--num-steps") + 1])
    assert len(steps) == 2 * num_steps
    ended = np.stack([step["life_lost"] | step["truncated"] for step in steps])
    truncated = np.stack([step["truncated"] & ~step["life_lost"] for step in steps])[-num_steps:]
    life_lost = np.stack([step["life_lost"] for step in steps])[-num_steps:]
    assert truncated.any() and life_lost.any(), "the test needs both ends in the last rollout"
    rewards = np.stack([step["clipped_reward"] for step in steps])[-num_steps:]
    dones = ended[-num_steps - 1 : -1].astype(np.float32)  # dones[t]: observation t is an episode's last frame
    if name == PLAIN:
        values, returns, mask = run_globals["values"], run_globals["returns"], run_globals["b_mask"].view(num_steps, -1)
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
            changed[key][end + 1 :, env] = torch.randn(num_steps - end - 1, generator=junk) * 100
        changed["next_value"][env] = 100.0
        recomputed = compute(**changed, gamma=args.gamma, q_lambda=args.q_lambda)
        torch.testing.assert_close(recomputed[: end + 1, env], returns[: end + 1, env], rtol=RTOL, atol=ATOL,
                                   msg=lambda m, e=end, i=env: f"step {e}, env {i}: {m}")  # fmt: skip
        assert end == num_steps - 1 or not torch.allclose(recomputed[end + 1 :, env], returns[end + 1 :, env])
    np.testing.assert_array_equal(mask.numpy(), 1.0 - dones)


def test_twin_run_matches_plain_run(recorded_run):
    """Same seed and flags: the twin (eager) plays the same games as the plain script, another seed other games, and
    the twin ends with the plain script's parameters (same draws in the same order; float32 rounding differs, in
    foreach RAdam and the parallel scan, far below what could change an action in so short a run). Two runs of one
    seed, in two scripts, playing the same games: the runs are a function of the seed (determinism)."""
    plain_globals, plain_steps = recorded_run(PLAIN, RUN_SEED)
    twin_globals, twin_steps = recorded_run(TWIN, RUN_SEED)
    assert twin_globals["episode_returns"] == plain_globals["episode_returns"]
    assert len(twin_steps) == len(plain_steps)
    for plain_step, twin_step in zip(plain_steps, twin_steps, strict=True):
        np.testing.assert_array_equal(twin_step["game_reward"], plain_step["game_reward"])
    other_seed = recorded_run(TWIN, RUN_SEED + 1)[0]["episode_returns"]
    assert other_seed != twin_globals["episode_returns"]
    args, iterations = plain_globals["args"], plain_globals["num_iterations"]
    lrs = [(1 - i / iterations) * args.learning_rate for i in range(iterations)]
    lrs = [lr for lr in lrs for _ in range(args.update_epochs * args.num_minibatches)]
    # RAdam's first steps are momentum SGD steps, lr times the gradient: allowed as 10 lr each (gradients stay small).
    twin_qnet, plain_qnet = built(twin_globals["pqn"], "qnet"), built(plain_globals["pqn"], "qnet")
    assert_params_close_after_steps(twin_qnet, plain_qnet, [10 * lr for lr in lrs], "parameters at the end of the run")
    assert_changed(params(build(load_script(PLAIN), seed=RUN_SEED)), params(plain_globals["pqn"]), "plain parameters")


# --- 7. Checkpoints: resume, the budget, refused checkpoints -----------------------------------------------------
#
# Iterations of 2 envs x 16 steps and one minibatch update each: a checkpoint's step count is a multiple of 32.

TINY_FLAGS = ("--env-id", "Breakout-v5", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "1",
              "--update-epochs", "1")  # fmt: skip
BATCH_STEPS = 32


@pytest.mark.parametrize("name", SCRIPTS)
def test_resume_continues_the_run_and_refuses_another_budget(name, tmp_path, saved_checkpoints, capsys, monkeypatch):
    """A run of 4 iterations saved after 2 and resumed from there ends as the uninterrupted run does (steps,
    iterations, optimizer steps, the last iteration's annealed learning rate) and acts with its epsilons (decaying over
    the whole run here). The learning-rate anneal and the epsilon decay are computed from --total-timesteps: a resume
    with another budget is refused in one line."""
    made = []
    monkeypatch.setattr(envpool, "make", recording_make(made, "epsilon_tensor" if name == TWIN else "epsilon"))
    flags = (*TINY_FLAGS, "--exploration-fraction", "1")
    resumed = check_resume_continues_the_run(name, flags, tmp_path, saved_checkpoints, steps=2 * BATCH_STEPS,
                                             same_as_shorter_run=False)  # fmt: skip
    uninterrupted, resumed_half = ([step["epsilon"] for step in envs.steps] for envs in made[:2])
    assert len(uninterrupted) == 2 * len(resumed_half) == 64 and resumed_half == uninterrupted[32:]
    assert len(set(resumed_half)) == 32, "epsilon does not fall after the checkpoint: the check proves little"
    mid, full = saved_checkpoints[:2]
    assert (mid["iteration"], full["iteration"], resumed["iteration"]) == (2, 4, 4)
    learning_rate = load_script(name).Args.learning_rate
    lr_of = lambda checkpoint: checkpoint["agent"]["optimizer"]["param_groups"][0]["lr"]  # noqa: E731
    # Iteration i of 4 anneals the learning rate to (1 - (i - 1) / 4) of its start: 3/4 at the checkpoint, 1/4 last.
    assert lr_of(mid) == pytest.approx(0.75 * learning_rate) and lr_of(full) == pytest.approx(0.25 * learning_rate)
    assert lr_of(resumed) == lr_of(full)
    capsys.readouterr()
    flags = (*flags, "--resume", tmp_path / "mid.pt", "--total-timesteps", 8 * BATCH_STEPS)
    check_bad_input_in_process(name, flags, ["--total-timesteps 128", "epsilon decay"], tmp_path, capsys)


# --- run.sh's tiny run of the pair: the results line, every flag combination of the twin (test_scripts.py's checks) ---
