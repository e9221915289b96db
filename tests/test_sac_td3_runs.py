"""The SAC and TD3 pairs as a user runs them: bad input, determinism, the results line, every flag combination of
the twin, checkpoints (resume, across the pair, refused), video and signals. Both pairs take the same run flags and
tiny runs, so each test here serves the four scripts, parametrized over them; what is each algorithm's own (its
updates, flags and defaults, learning) is tested in test_sac.py and test_td3.py."""

import signal

import pytest
from checks import (
    TINY_RUN,
    check_bad_checkpoints_are_refused,
    check_bad_input,
    check_bad_input_in_process,
    check_checkpoints_load_across_the_pair,
    check_plain_results_line_is_appended,
    check_resume_continues_the_run,
    check_same_seed_same_returns,
    check_signal_stops_the_run,
    check_twin_runs_with_cudagraphs_on_cuda,
    check_twin_runs_with_every_flag_combination,
    check_video_of_the_evaluation,
)
from helpers import requires_cuda, run_in_process

PAIRS = {"sac": "sac_continuous_action", "td3": "td3_continuous_action"}  # algo: its plain script
OTHER = {"sac": "td3", "td3": "sac"}  # whose checkpoint each pair must refuse
SCRIPTS = [plain + twin for plain in PAIRS.values() for twin in ("", "_torchcompile")]
TINY_FLAGS = ("--env-id", "Pendulum-v1", "--learning-starts", "100", "--batch-size", "32")


def algo_of(name):
    return next(algo for algo, plain in PAIRS.items() if name.startswith(plain))


# --- Bad input ----------------------------------------------------------------------------------------------------

BAD_INPUTS = {
    "unknown-env": (("--env-id", "NoSuchEnv-v0"), ("NoSuchEnv",)),
    "negative-seed": (("--seed", "-1"), ("seed", "-1")),
    "discrete-env": (("--env-id", "CartPole-v1"), ("CartPole-v1",)),
    "zero-steps": (("--env-id", "Pendulum-v1", "--total-timesteps", "0"), ("total-timesteps",)),
    "batch-over-buffer": (
        ("--env-id", "Pendulum-v1", "--batch-size", "512", "--buffer-size", "256"),
        ("batch-size", "buffer-size"),
    ),
    "zero-envs": (("--env-id", "Pendulum-v1", "--num-envs", "0"), ("num-envs",)),
    "zero-gradient-steps": (("--env-id", "Pendulum-v1", "--gradient-steps", "0"), ("gradient-steps",)),
    "envs-over-buffer": (
        ("--env-id", "Pendulum-v1", "--num-envs", "8", "--buffer-size", "4", "--batch-size", "4"),
        ("num-envs", "buffer-size"),
    ),
    "checkpoint-every-without-save": (("--env-id", "Pendulum-v1", "--checkpoint-every", "100"), ("save-model",)),
    "video-without-save": (("--env-id", "Pendulum-v1", "--capture-video"), ("save-model",)),
    "negative-eval-episodes": (("--env-id", "Pendulum-v1", "--eval-episodes", "-1"), ("eval-episodes",)),
}
OWN_BAD_INPUTS = {  # an algorithm's own flags
    "td3": {"negative-noise": (("--env-id", "Pendulum-v1", "--exploration-noise", "-0.1"), ("exploration-noise",))},
}
BAD_INPUT_CASES = [
    pytest.param(name, flags, words, id=f"{name}-{case}")
    for name in SCRIPTS
    for case, (flags, words) in {**BAD_INPUTS, **OWN_BAD_INPUTS.get(algo_of(name), {})}.items()
]


@pytest.mark.parametrize(("name", "flags", "expected_words"), BAD_INPUT_CASES)
def test_bad_input_exits_2_with_one_clear_line(name, flags, expected_words, tmp_path, capsys):
    check_bad_input_in_process(name, flags, expected_words, tmp_path, capsys)


@pytest.mark.parametrize("name", SCRIPTS)
def test_bad_input_from_the_command_line(name, tmp_path):
    """One case as a user meets it, in a subprocess: one line, exit status 2, no traceback."""
    flags, expected_words = BAD_INPUTS["unknown-env"]
    check_bad_input(name, flags, expected_words, tmp_path)


# --- Determinism, --results-path, and every flag combination of the twin (CPU), --cudagraphs on CUDA ------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_same_seed_same_returns(name):
    check_same_seed_same_returns(name)


@pytest.mark.parametrize("algo", PAIRS)
def test_plain_results_line_is_appended(algo, tmp_path):
    check_plain_results_line_is_appended(PAIRS[algo], algo, tmp_path, tiny=TINY_RUN)  # run.sh's tiny budget


@pytest.mark.parametrize("algo", PAIRS)
def test_twin_runs_with_every_flag_combination_and_appends_results(algo, tmp_path):
    check_twin_runs_with_every_flag_combination(PAIRS[algo] + "_torchcompile", algo, tmp_path, tiny=TINY_RUN)


@requires_cuda
@pytest.mark.parametrize("algo", PAIRS)
def test_twin_runs_with_cudagraphs_on_cuda(algo, tmp_path):
    check_twin_runs_with_cudagraphs_on_cuda(PAIRS[algo] + "_torchcompile", algo, tmp_path)


# --- Checkpoints: resume, evaluation across the pair, interruption, video, refused checkpoints ----------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_resume_continues_the_run(name, tmp_path, saved_checkpoints):
    # Saved at step 300, after 200 updates (learning starts at 100), and resumed to 600.
    check_resume_continues_the_run(name, TINY_FLAGS, tmp_path, saved_checkpoints, steps=300, same_as_shorter_run=True)


@pytest.mark.parametrize("algo", PAIRS)
def test_checkpoints_load_across_the_pair(algo, tmp_path):
    plain = PAIRS[algo]
    check_checkpoints_load_across_the_pair(plain, plain + "_torchcompile", (*TINY_FLAGS, "--total-timesteps", "300"),
                                           tmp_path)  # fmt: skip


@pytest.mark.parametrize("name", SCRIPTS)
def test_bad_checkpoints_are_refused(name, tmp_path, capsys):
    flags = (*TINY_FLAGS, "--total-timesteps", "150")
    for script, checkpoint in ((name, "agent.pt"), (PAIRS[OTHER[algo_of(name)]], "other_algo.pt")):
        run_in_process(script, *flags, "--save-model", "--model-path", tmp_path / checkpoint, "--eval-episodes", "0")
    check_bad_checkpoints_are_refused(
        name, flags, tmp_path / "agent.pt", tmp_path / "other_algo.pt", ("--gamma", "0.9"), tmp_path, capsys
    )


@pytest.mark.parametrize("algo", PAIRS)
def test_video_of_the_evaluation(algo, tmp_path):
    check_video_of_the_evaluation(PAIRS[algo] + "_torchcompile",
                                  ("--learning-starts", "100", "--batch-size", "32", "--total-timesteps", "200"),
                                  tmp_path)  # fmt: skip


# A plain script and its twin share the handler and the loop's exit: one signal each.
@pytest.mark.parametrize(
    ("name", "signum"),
    [
        (plain + twin, signum)
        for plain in PAIRS.values()
        for twin, signum in (("", signal.SIGINT), ("_torchcompile", signal.SIGTERM))
    ],  # fmt: skip
)
def test_signal_stops_the_run_with_a_checkpoint(name, signum, tmp_path):
    check_signal_stops_the_run(name, TINY_FLAGS, signum, tmp_path)
