"""Tests of the SAC pair: leanrl/sac_continuous_action.py (plain) and its twin sac_continuous_action_torchcompile.py.

Everything goes through the scripts' stable interface: Args, build_sac and the namespace it returns, the
command line, the `episode_returns` global of a run, the --results-path JSON line, and exit statuses.
"""

import statistics

import numpy as np
import pytest
import torch
from conftest import (
    ATOL,
    RTOL,
    assert_changed,
    assert_leaves_close,
    check_args_of_the_pair_match,
    check_bad_input,
    check_every_flag_has_a_docstring_shown_by_help,
    check_plain_results_line_is_appended,
    check_same_seed_same_returns,
    check_twin_runs_with_every_flag_combination,
    leaves,
    load_script,
    random_batch,
    run_in_process,
)
from tensordict import TensorDict

PLAIN = "sac_continuous_action"
TWIN = "sac_continuous_action_torchcompile"
SCRIPTS = (PLAIN, TWIN)

OBS_DIM, ACTION_DIM, BATCH = 17, 6, 64
LOW, HIGH = -np.ones(ACTION_DIM, dtype=np.float32), np.ones(ACTION_DIM, dtype=np.float32)


def build(module, seed=0, **arg_overrides):
    torch.manual_seed(seed)
    args = module.Args(**arg_overrides)
    return module.build_sac(OBS_DIM, ACTION_DIM, LOW, HIGH, args, torch.device("cpu"))


# --- 1. Learning ----------------------------------------------------------------------------------------------

# Seed 1 is not cherry-picked: seeds 1 and 2 both pass with a wide margin (mean of the last 10 returns about -140
# and -165 for both scripts; the rolling mean crosses -300 near episode 24 of 60 and stays above).
LEARNING_SEED = 1
LEARNING_STARTS = 1000
LEARNING_STEPS = 12000
LEARNING_THRESHOLD = -300.0  # random policy: about -1200 on Pendulum-v1; a solved one: about -150


@pytest.mark.parametrize(("name", "flags"), [(PLAIN, ()), (TWIN, ("--compile",))], ids=["plain", "twin-compile"])
def test_learns_pendulum(name, flags):
    run = run_in_process(
        name,
        "--env-id", "Pendulum-v1",
        "--seed", LEARNING_SEED,
        "--total-timesteps", LEARNING_STEPS,
        "--learning-starts", LEARNING_STARTS,
        *flags,
    )  # fmt: skip
    returns = run["episode_returns"]
    assert len(returns) == LEARNING_STEPS // 200, f"Pendulum-v1 episodes last 200 steps; got {len(returns)} episodes"
    last10 = returns[-10:]
    print(f"{name} {' '.join(flags)}: mean of the last 10 returns {statistics.mean(last10):.1f}; returns {returns}")
    assert statistics.mean(last10) > LEARNING_THRESHOLD, f"last 10 returns {[round(r) for r in last10]}"


# --- 2. Compiled and eager updates of the twin agree --------------------------------------------------------------


def snapshot(sac):
    return {
        "qnet": leaves(sac.qnet_params.data),
        "target": leaves(sac.target_qnet_params),
        "actor": {k: v.detach().clone() for k, v in sac.actor.state_dict().items()},
        "log_alpha": {"log_alpha": sac.log_alpha.detach().clone()},
    }


def test_twin_compiled_updates_match_eager(inductor_fallback_random):
    module = load_script(TWIN)
    eager = build(module, compile=False)
    compiled = build(module, compile=True)
    start = snapshot(eager)
    for group, tensors in snapshot(compiled).items():
        assert_leaves_close(tensors, start[group], f"initial {group}")

    batch = random_batch(BATCH, OBS_DIM, ACTION_DIM, seed=123)
    for round_ in range(3):  # several rounds: Adam's moments and step count take part
        losses = {}
        for label, sac in (("eager", eager), ("compiled", compiled)):
            torch.manual_seed(1000 + round_)
            losses[label] = leaves(sac.update_critic(batch))
        assert "qf_loss" in losses["eager"]
        assert_leaves_close(losses["compiled"], losses["eager"], f"round {round_} critic losses")
        assert_leaves_close(
            leaves(compiled.qnet_params.data), leaves(eager.qnet_params.data), f"round {round_} Q parameters"
        )

        for label, sac in (("eager", eager), ("compiled", compiled)):
            torch.manual_seed(2000 + round_)
            losses[label] = leaves(sac.update_actor(batch))
        assert {"actor_loss", "alpha_loss"} <= losses["eager"].keys()
        assert_leaves_close(losses["compiled"], losses["eager"], f"round {round_} actor losses")
        after_eager, after_compiled = snapshot(eager), snapshot(compiled)
        assert_leaves_close(after_compiled["actor"], after_eager["actor"], f"round {round_} actor parameters")
        assert_leaves_close(after_compiled["log_alpha"], after_eager["log_alpha"], f"round {round_} log_alpha")

        eager.update_targets()
        compiled.update_targets()
        assert_leaves_close(
            leaves(compiled.target_qnet_params), leaves(eager.target_qnet_params), f"round {round_} target Q"
        )

    end = snapshot(eager)
    for group in ("qnet", "target", "actor", "log_alpha"):
        assert_changed(start[group], end[group], f"eager twin's {group}")
    for label, sac in (("eager", eager), ("compiled", compiled)):
        for key, value in leaves(sac.update_critic(batch)).items():
            assert torch.isfinite(value).all(), f"{label} {key} is not finite"


def test_twin_compiled_policy_matches_eager(inductor_fallback_random):
    module = load_script(TWIN)
    eager = build(module, compile=False)
    compiled = build(module, compile=True)
    obs = torch.randn(1, OBS_DIM, generator=torch.Generator().manual_seed(7))
    actions = {}
    for label, sac in (("eager", eager), ("compiled", compiled)):
        torch.manual_seed(42)
        actions[label] = [sac.policy(obs).clone() for _ in range(2)]
    for step in range(2):
        assert actions["eager"][step].shape == (1, ACTION_DIM)
        torch.testing.assert_close(actions["compiled"][step], actions["eager"][step], rtol=RTOL, atol=ATOL)
        assert actions["eager"][step].abs().max() <= 1.0, "actions leave the action bounds"
    assert not torch.equal(actions["eager"][0], actions["eager"][1]), "the policy does not sample"


def test_twin_eager_updates_match_plain():
    """Same start, same batch, same noise: the twin's eager updates compute what the plain script computes.

    The plain agent's target networks are not exposed; they enter the next round's critic loss, which is compared.
    """
    plain_module, twin_module = load_script(PLAIN), load_script(TWIN)
    plain, twin = build(plain_module), build(twin_module)

    def plain_qnet():
        """The plain agent's two Q networks, stacked like the twin's ensemble (a copy)."""
        return torch.stack([TensorDict.from_module(plain.qf1).data, TensorDict.from_module(plain.qf2).data]).clone()

    # Give the twin the plain agent's networks; the targets start as copies of the Q networks in both.
    twin.actor.load_state_dict(plain.actor.state_dict())
    start = plain_qnet()
    assert leaves(start).keys() == leaves(twin.qnet_params.data).keys()
    twin.qnet_params.data.update_(start)
    twin.target_qnet_params.update_(start)
    assert torch.equal(twin.log_alpha, plain.log_alpha)

    batch = random_batch(BATCH, OBS_DIM, ACTION_DIM, seed=321)
    plain_batch = {key: value.clone() for key, value in batch.items()}
    for round_ in range(3):
        torch.manual_seed(round_)
        plain_losses = plain.update_critic(plain_batch)
        torch.manual_seed(round_)
        twin_losses = twin.update_critic(batch)
        torch.testing.assert_close(twin_losses["qf_loss"], plain_losses["qf_loss"], rtol=RTOL, atol=ATOL)
        assert_leaves_close(leaves(twin.qnet_params.data), leaves(plain_qnet()), f"round {round_} Q parameters")

        torch.manual_seed(100 + round_)
        plain_losses = plain.update_actor(plain_batch)
        torch.manual_seed(100 + round_)
        twin_losses = twin.update_actor(batch)
        for key in ("actor_loss", "alpha_loss"):
            torch.testing.assert_close(twin_losses[key], plain_losses[key], rtol=RTOL, atol=ATOL)
        assert_leaves_close(twin.actor.state_dict(), plain.actor.state_dict(), f"round {round_} actor")
        torch.testing.assert_close(twin.log_alpha, plain.log_alpha, rtol=RTOL, atol=ATOL)

        plain.update_targets()
        twin.update_targets()
    assert_changed(leaves(start), leaves(plain_qnet()), "plain Q networks")


# --- 3. Flags ---------------------------------------------------------------------------------------------------


def test_args_of_the_pair_match_but_for_compile_and_cudagraphs():
    # The flags every script has are checked in conftest; here SAC's own, with CleanRL's defaults.
    expected = {
        "env_id": "HalfCheetah-v5",
        "total_timesteps": 1_000_000,
        "buffer_size": 1_000_000,
        "gamma": 0.99,
        "tau": 0.005,
        "batch_size": 256,
        "learning_starts": 5000,
        "policy_lr": 3e-4,
        "q_lr": 1e-3,
        "policy_frequency": 2,
        "target_network_frequency": 1,
        "alpha": 0.2,
        "autotune": True,
    }
    check_args_of_the_pair_match(PLAIN, TWIN, expected)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_flag_has_a_docstring_shown_by_help(name):
    check_every_flag_has_a_docstring_shown_by_help(name)


# --- 4. Bad input -------------------------------------------------------------------------------------------------

BAD_INPUTS = {
    "unknown-env": (("--env-id", "NoSuchEnv-v0"), ("NoSuchEnv",)),
    "negative-seed": (("--seed", "-1"), ("seed", "-1")),
    "discrete-env": (("--env-id", "CartPole-v1"), ("CartPole-v1",)),
    "zero-steps": (("--env-id", "Pendulum-v1", "--total-timesteps", "0"), ("total-timesteps",)),
    "batch-over-buffer": (
        ("--env-id", "Pendulum-v1", "--batch-size", "512", "--buffer-size", "256"),
        ("batch-size", "buffer-size"),
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
@pytest.mark.parametrize("name", SCRIPTS)
def test_bad_input_exits_2_with_one_clear_line(name, case, tmp_path):
    flags, expected_words = BAD_INPUTS[case]
    check_bad_input(name, flags, expected_words, tmp_path)


# --- 5. Determinism -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_same_seed_same_returns(name):
    check_same_seed_same_returns(name)


# --- 6 and 7. --results-path, and every flag combination of the twin on CPU -------------------------------------


def test_plain_results_line_is_appended(tmp_path):
    check_plain_results_line_is_appended(PLAIN, "sac", tmp_path)


def test_twin_runs_with_every_flag_combination_and_appends_results(tmp_path):
    check_twin_runs_with_every_flag_combination(TWIN, "sac", tmp_path)
