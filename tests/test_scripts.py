"""The checks every script pair passes the same way, over one table of the pairs (flags, --help, bad input, results
lines, determinism, the twin's flag combinations, checkpoints, video, signals); an algorithm's own: its pair's file."""

import ast
import contextlib
import dataclasses
import functools
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import run_utils
import torch
from checks import assert_same_state, check_bad_input_in_process
from helpers import (
    REPO_ROOT,
    RESULT_FIELDS,
    SCRIPTS_DIR,
    TinyRun,
    args_fields,
    describe,
    field_default,
    is_number,
    load_checkpoint,
    load_script,
    one_torch_thread,
    read_results,
    requires_cuda,
    run_in_process,
    run_script,
    run_script_in_process,
    run_sh_budget,
    run_sh_tiny_run,
    script_path,
    time_limit,
)

TWIN_ONLY_FIELDS = frozenset({"compile", "cudagraphs"})
BF16_TWIN_ONLY_FIELDS = TWIN_ONLY_FIELDS | {"bf16"}  # the twins whose updates are matrix products enough to pay
COMMON_FIELDS = ("exp_name", "seed", "torch_deterministic", "cuda", "track", "wandb_project_name", "wandb_entity",
                 "env_id", "total_timesteps", "measure_burnin", "results_path", "save_model", "model_path",
                 "checkpoint_every", "resume", "eval_episodes", "capture_video")  # fmt: skip
# SAC and TD3: 300 steps > learning_starts (100) + measure_burnin (3 by default), so sps is measured; one 200-step
# Pendulum-v1 episode finishes, and a step's reward lies in [-16.3, 0]. run.sh's line for SAC and TD3.
TINY_RUN = run_sh_tiny_run("sac_continuous_action", "Pendulum-v1", (-3300, 0))
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # the Atari CNN's OpenMP threads wait for one another on a small machine
CARTPOLE_DQN = ("--env-id", "CartPole-v1", "--learning-starts", "200", "--batch-size", "32", "--train-frequency", "2")
CARTPOLE_PQN = ("--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2",
                "--update-epochs", "1")  # fmt: skip
PENDULUM = ("--env-id", "Pendulum-v1", "--learning-starts", "100", "--batch-size", "32")
# Iterations of 64 steps (a multiple divides the signal check's 10**6 steps, so its progress bar shows that total).
INVERTED_PENDULUM = ("--env-id", "InvertedPendulum-v5", "--num-steps", "64", "--num-minibatches", "2",
                     "--update-epochs", "2")  # fmt: skip
# Iterations of 2 envs x 16 steps and one minibatch update each: a checkpoint's step count is a multiple of 32.
BREAKOUT = ("--env-id", "Breakout-v5", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "1",
            "--update-epochs", "1")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Pair:
    algo: str  # the results line's "algo"
    plain: str
    defaults: dict  # CleanRL's defaults of the algorithm's own flags
    tiny: TinyRun  # run.sh's tiny run of the pair
    flags: tuple  # a short run's flags (no --total-timesteps): checkpoints, signals
    bad_input: tuple  # (scripts, flags, words): one bad input as a user meets it, in a subprocess
    twin_only: frozenset = TWIN_ONLY_FIELDS
    cuda_tiny: TinyRun | None = None  # the tiny run of --cudagraphs on CUDA, where not `tiny`; None: not checked
    across_steps: int = 64  # --total-timesteps of the runs whose checkpoints are loaded across the pair and refused
    refused: tuple = ("ppo_continuous", ("--num-steps", "8"))  # (another algorithm, a changed hyper-parameter)
    video: tuple | None = None  # (flags, env_id, an episode's return from its frame count)
    signals: tuple = ("plain", "twin")  # the scripts signalled: the plain one with SIGINT, the twin with SIGTERM
    iteration_steps: int = 1  # an interrupted run's steps are a multiple of this
    same_seed: tuple = ()  # (scripts, flags, least episodes) of test_same_seed_same_returns

    def __str__(self):
        return self.algo

    @property
    def twin(self):
        return self.plain + "_torchcompile"


PLAIN, TWIN = "plain", "twin"
BOTH = (PLAIN, TWIN)
# fmt: off
PAIRS = [
    Pair("dqn", "dqn", dict(env_id="CartPole-v1", total_timesteps=500_000, learning_rate=2.5e-4, buffer_size=10_000,
                            gamma=0.99, tau=1.0, target_network_frequency=500, batch_size=128, start_e=1.0, end_e=0.05,
                            exploration_fraction=0.5, learning_starts=10_000, train_frequency=10),
         # 400 steps > learning_starts (200) + measure_burnin (3) gradient steps: sps is measured; episodes finish.
         run_sh_tiny_run("dqn", "CartPole-v1", (0, 500)), CARTPOLE_DQN,
         (BOTH, ("--env-id", "Pendulum-v1"), ("Pendulum-v1", "discrete")),
         across_steps=600, refused=("sac", ("--gamma", "0.9")),
         same_seed=(BOTH, (*CARTPOLE_DQN, "--total-timesteps", "1400"), 20),
         video=((*CARTPOLE_DQN, "--total-timesteps", "300"), "CartPole-v1", lambda n: n)),  # CartPole: 1 each step
    Pair("pqn", "pqn", dict(env_id="CartPole-v1", total_timesteps=500_000, learning_rate=2.5e-4, num_envs=4,
                            num_steps=128, num_minibatches=4, update_epochs=4, anneal_lr=True, gamma=0.99, start_e=1.0,
                            end_e=0.05, exploration_fraction=0.5, max_grad_norm=10.0, q_lambda=0.65),
         # 6 rollouts of 8 x 32 steps: sps measured after measure_burnin (3) iterations; episodes finish.
         run_sh_tiny_run("pqn", "CartPole-v1", (0, 500)), CARTPOLE_PQN,
         ((TWIN,), ("--q-lambda", "2"), ("q-lambda", "[0, 1]")),
         # value() and returns() are recorded in the 5th iteration (CudaGraphModule(warmup=5)), later ones replay them.
         cuda_tiny=TinyRun((*CARTPOLE_PQN, "--total-timesteps", "320"), "CartPole-v1", 320, (0, 500)),
         refused=("dqn", ("--q-lambda", "0.9")),
         same_seed=(BOTH, (*CARTPOLE_PQN, "--total-timesteps", "1024", "--exploration-fraction", "0.2"), 5),
         signals=(TWIN,)),
    *(
        Pair(algo, f"{algo}_continuous_action", defaults,
             TINY_RUN, PENDULUM, (BOTH, ("--env-id", "NoSuchEnv-v0"), ("NoSuchEnv",)), twin_only=BF16_TWIN_ONLY_FIELDS,
             across_steps=300, refused=(other, ("--gamma", "0.9")),
             same_seed=(BOTH, (*PENDULUM, "--total-timesteps", "500"), 2),  # 2 episodes, learning from step 100
             video=(("--learning-starts", "100", "--batch-size", "32", "--total-timesteps", "200"),
                    "InvertedPendulum-v5", lambda n: n - 1))  # 0 on the step that drops the pole
        for algo, other, defaults in (
            ("sac", "td3", dict(env_id="HalfCheetah-v5", total_timesteps=1_000_000, buffer_size=1_000_000, gamma=0.99,
                                tau=0.005, batch_size=256, learning_starts=5000, policy_lr=3e-4, q_lr=1e-3,
                                policy_frequency=2, target_network_frequency=1, alpha=0.2, autotune=True)),
            ("td3", "sac", dict(env_id="HalfCheetah-v5", total_timesteps=1_000_000, learning_rate=3e-4,
                                buffer_size=1_000_000, gamma=0.99, tau=0.005, batch_size=256, policy_noise=0.2,
                                exploration_noise=0.1, learning_starts=25_000, policy_frequency=2, noise_clip=0.5)),
        )
    ),
    Pair("ppo_continuous", "ppo_continuous_action",
         dict(env_id="HalfCheetah-v5", total_timesteps=1_000_000, learning_rate=3e-4, num_envs=1, num_steps=2048,
              anneal_lr=True, gamma=0.99, gae_lambda=0.95, num_minibatches=32, update_epochs=10, norm_adv=True,
              clip_coef=0.2, clip_vloss=True, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, target_kl=None),
         # 4 rollouts of 64 steps, one more than measure_burnin: sps measured; InvertedPendulum earns 1 a step.
         run_sh_tiny_run("ppo_continuous_action", "InvertedPendulum-v5", (0, 1000)), INVERTED_PENDULUM,
         (BOTH, ("--env-id", "NoSuchEnv-v0"), ("NoSuchEnv",)),
         across_steps=128, refused=("sac", ("--clip-coef", "0.1")),
         same_seed=(BOTH, (*INVERTED_PENDULUM, "--total-timesteps", "384"), 10),
         video=((*INVERTED_PENDULUM[2:], "--total-timesteps", "64"), "InvertedPendulum-v5", lambda n: n - 1)),
    Pair("ppo_atari", "ppo_atari_envpool",
         dict(env_id="Breakout-v5", total_timesteps=10_000_000, learning_rate=2.5e-4, num_envs=8, num_steps=128,
              anneal_lr=True, gamma=0.99, gae_lambda=0.95, num_minibatches=4, update_epochs=4, norm_adv=True,
              clip_coef=0.1, clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, target_kl=None),
         # 8 rollouts of 2 x 32 steps: sps measured; games end within 256 steps an env; a score is a whole number >= 0.
         run_sh_tiny_run("ppo_atari_envpool", "Breakout-v5", (-1, 10_000), env=ONE_THREAD), BREAKOUT,
         (BOTH, ("--env-id", "NoSuchGame-v5"), ("NoSuchGame-v5",)), twin_only=BF16_TWIN_ONLY_FIELDS,
         iteration_steps=32),
    Pair("pqn_atari", "pqn_atari_envpool",
         dict(env_id="Breakout-v5", total_timesteps=10_000_000, learning_rate=2.5e-4, num_envs=8, num_steps=128,
              anneal_lr=True, gamma=0.99, num_minibatches=4, update_epochs=4, max_grad_norm=10.0, start_e=1.0,
              end_e=0.01, exploration_fraction=0.10, q_lambda=0.65),
         # 8 iterations of 2 x 32 steps: sps measured; a Breakout game ends within 160 steps an env (seeds 1 and 2).
         run_sh_tiny_run("pqn_atari_envpool", "Breakout-v5", (-1, 10_000), env=ONE_THREAD), BREAKOUT,
         ((TWIN,), ("--env-id", "HalfCheetah-v5"), ("HalfCheetah-v5", "Atari")), twin_only=BF16_TWIN_ONLY_FIELDS,
         refused=("ppo_atari", ("--q-lambda", "0.9")), iteration_steps=32),
    Pair("ppo_atari_distributed", "ppo_atari_envpool_distributed",
         dict(env_id="Breakout-v5", total_timesteps=10_000_000, num_envs=8, num_steps=128, num_minibatches=4,
              update_epochs=4, target_kl=None),
         # The single-process pair's tiny budget; run.sh --tiny launches this pair as a world of one, as these runs do.
         run_sh_tiny_run("ppo_atari_envpool_distributed", "Breakout-v5", (-1, 10_000), env=ONE_THREAD), BREAKOUT,
         (), twin_only=BF16_TWIN_ONLY_FIELDS, signals=(TWIN,), iteration_steps=32),
]
# fmt: on
PAIRS = {pair.algo: pair for pair in PAIRS}
SCRIPTS = [pytest.param(pair, name, id=name) for pair in PAIRS.values() for name in (pair.plain, pair.twin)]


def pairs_with(attribute):
    return [pair for pair in PAIRS.values() if getattr(pair, attribute)]


def scripts_with(attribute):
    """(pair, script) of the scripts (PLAIN, TWIN) the pairs' `attribute` names first: (scripts, ...)."""
    scripts = [(p, getattr(p, kind)) for p in pairs_with(attribute) for kind in getattr(p, attribute)[0]]
    return [pytest.param(p, name, id=name) for p, name in scripts]


@pytest.fixture
def threads(request):
    """The Atari pairs' runs on one thread, in this process too."""
    with one_torch_thread() if request.node.callspec.params["pair"].tiny.env else contextlib.nullcontext():
        yield


# --- Flags --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", PAIRS.values(), ids=str)
def test_args_of_the_pair_match_but_for_the_speed_flags(pair):
    """The twin has the plain script's fields (same order, types, defaults) plus its speed flags (all False): compile
    and cudagraphs, and bf16 in the Atari, SAC and TD3 twins. Both have the fields every script has (CONVENTIONS.md)
    with their defaults, and the algorithm's own with CleanRL's."""
    plain, twin = args_fields(load_script(pair.plain)), args_fields(load_script(pair.twin))
    assert set(twin) - set(plain) == pair.twin_only
    assert [name for name in twin if name in plain] == list(plain), "shared fields in another order"
    for name, field in plain.items():
        assert twin[name].type == field.type, f"{name}: type {twin[name].type} vs {field.type}"
        if name == "exp_name":  # defaults to the script's own name
            assert field_default(field) == pair.plain and field_default(twin[name]) == pair.twin
        else:
            assert field_default(twin[name]) == field_default(field), f"{name}: defaults differ"
    for name in pair.twin_only:
        assert twin[name].type in (bool, "bool") and field_default(twin[name]) is False, name
    assert set(COMMON_FIELDS) <= set(plain), set(COMMON_FIELDS) - set(plain)
    common = dict(cuda=True, track=False, results_path=None, wandb_project_name="leanrl", save_model=False,
                  model_path=None, checkpoint_every=0, resume=None, eval_episodes=10, capture_video=False)  # fmt: skip
    expected = {**common, **pair.defaults}
    assert {name: field_default(plain[name]) for name in expected} == expected


def class_docstrings(path, class_name):
    """{field: the string right after it} of a class in a source file."""
    tree = ast.parse(path.read_text())
    (args_class,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name]
    docs, body = {}, args_class.body
    for node, following in zip(body, [*body[1:], None], strict=True):
        if isinstance(node, ast.AnnAssign):  # the string after it, read as a module's docstring
            docs[node.target.id] = ast.get_docstring(ast.Module([following], [])) or ""
    return docs


@pytest.mark.parametrize(("pair", "name"), SCRIPTS)
def test_every_flag_has_a_docstring_shown_by_help(pair, name, monkeypatch):
    # The fields of the script's Args, with those it inherits from run_utils.RunArgs (the flags every script has).
    docs = {**class_docstrings(SCRIPTS_DIR / "run_utils.py", "RunArgs"), **class_docstrings(script_path(name), "Args")}
    assert set(docs) == set(args_fields(load_script(name)))
    missing = [field for field, doc in docs.items() if not doc]
    assert not missing, f"fields without a docstring: {missing}"
    monkeypatch.setenv("COLUMNS", "200")
    completed = run_script_in_process(name, "--help")
    assert completed.returncode == 0, describe(completed)
    squash = lambda text: " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())  # noqa: E731 (tyro's box drawing)
    help_text = squash(completed.stdout)
    for field, doc in docs.items():
        assert f"--{field.replace('_', '-')}" in help_text, f"--help does not list {field}"
        assert squash(doc) in help_text, f"--help does not show the docstring of {field}: {doc!r}"


@pytest.mark.parametrize(("pair", "name"), scripts_with("bad_input"))
def test_bad_input_from_the_command_line(pair, name, tmp_path):
    """One bad input as a user meets it, in a subprocess: exit status 2, one stderr line naming the problem, no
    traceback, no results written. (Each pair's own file tests its cases in this process.)"""
    _, flags, words = pair.bad_input
    results = tmp_path / "results.jsonl"
    completed = run_script(name, *flags, "--results-path", results, timeout=300)
    assert completed.returncode == 2, describe(completed)
    assert "Traceback" not in completed.stderr + completed.stdout, describe(completed)
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, describe(completed)
    assert all(word in lines[0].replace("_", "-") for word in words), (words, lines[0])
    assert not results.exists(), "a failed run wrote results"


# --- Runs: the results line, same seed, every flag combination of the twin (CPU), --cudagraphs on CUDA ------------


def output_lines(completed):
    """The lines a run printed (stdout then stderr), split on newlines and tqdm's carriage returns."""
    text = completed.stdout + "\n" + completed.stderr
    return [line.strip() for line in text.replace("\r", "\n").split("\n") if line.strip()]


def check_cudagraphs_message(completed, asked_for_cudagraphs, on_cuda=False):
    """On the CPU, --cudagraphs gets exactly one line saying they are off; without it, no such line. On CUDA, no line
    says they are off (tensordict logs the setting up of each CudaGraphModule: that line is fine)."""
    mentions = [line for line in output_lines(completed) if "cudagraph" in line.lower()]
    says_off = [line for line in mentions if re.search(r"\boff\b|disabl|needs? a cuda", line.lower())]
    if on_cuda:
        assert not says_off, says_off
    elif asked_for_cudagraphs:
        assert len(mentions) == 1, f"expected one line saying cudagraphs are off, got {mentions}"
        assert says_off == mentions, mentions[0]
    else:
        assert not mentions, mentions


def check_result(result, name, algo, seed, compile_, tiny, device="cpu", cudagraphs=False):
    """One results line of a tiny run: every field, with the right types and values."""
    assert set(RESULT_FIELDS) <= result.keys(), f"missing fields: {set(RESULT_FIELDS) - result.keys()}"
    fields = ("script", "algo", "env_id", "seed", "device", "torch_version", "total_timesteps")
    expected = (f"{name}.py", algo, tiny.env_id, seed, device, torch.__version__, tiny.total_timesteps)
    assert tuple(result[key] for key in fields) == expected
    assert result["compile"] is compile_ and result["cudagraphs"] is cudagraphs, "as asked (cudagraphs off on the CPU)"
    assert all(is_number(result[key]) for key in ("sps", "compile_seconds", "wall_seconds")), result
    assert result["sps"] > 0 and result["compile_seconds"] >= 0 and result["wall_seconds"] > 0, result
    low, high = tiny.return_range
    assert is_number(result["final_return"]) and low < result["final_return"] <= high, result["final_return"]


def tiny_runs(pair, name, combinations, tmp_path, seeds=(1,), cuda=False):
    """run.sh's tiny run of a script once per flag combination (and seed), each appending a results line checked
    field by field; the lines."""
    tiny = (pair.cuda_tiny or pair.tiny) if cuda else pair.tiny
    if not cuda:  # run.sh's tiny budget of the pair
        assert tiny.flags == run_sh_budget("tiny", pair.plain), f"{name}: a tiny run other than run.sh's"
    results, count = tmp_path / "results.jsonl", 0
    run = functools.partial(run_script, cuda=True) if cuda else run_script_in_process
    for seed in seeds:
        for flags in combinations:
            completed = run(name, *tiny.flags, "--seed", seed, "--results-path", results, *flags, env=tiny.env)
            assert completed.returncode == 0, f"flags {flags}: {describe(completed)}"
            assert "Traceback" not in completed.stderr, describe(completed)
            assert tiny.env_id in completed.stdout.strip().splitlines()[-1], "no summary line"
            if name == pair.twin:
                check_cudagraphs_message(completed, "--cudagraphs" in flags, on_cuda=cuda)
            lines, count = read_results(results), count + 1
            assert len(lines) == count, "the results file was not appended to"
            check_result(lines[-1], name, pair.algo, seed, compile_="--compile" in flags, tiny=tiny,
                         device="cuda" if cuda else "cpu", cudagraphs=cuda and "--cudagraphs" in flags)  # fmt: skip
    return read_results(results)


@pytest.mark.parametrize("pair", PAIRS.values(), ids=str)
def test_plain_results_line_is_appended(pair, tmp_path):
    """Two runs of the plain script on run.sh's tiny budget append two results lines, in order, and print a summary
    line: with the next test, every line of run.sh --tiny runs here (so run.sh's own test need not run every pair)."""
    assert [line["seed"] for line in tiny_runs(pair, pair.plain, [()], tmp_path, seeds=(1, 2))] == [1, 2]


@pytest.mark.parametrize(("pair", "name"), scripts_with("same_seed"))
def test_same_seed_same_returns(pair, name):
    """The same seed twice gives the same episodic returns, learning included; another seed gives others, also past
    the first episode."""
    _, flags, episodes = pair.same_seed
    first, second, other = (run_in_process(name, *flags, "--seed", seed)["episode_returns"] for seed in (1, 1, 2))
    assert len(first) >= episodes and all(isinstance(value, float) for value in first), first
    assert second == first and other[1:] != first[1:], other


@pytest.mark.parametrize("pair", PAIRS.values(), ids=str)
def test_twin_runs_with_every_flag_combination_and_appends_results(pair, tmp_path):
    """On the CPU, the twin runs with no flag, --compile, --cudagraphs and both; cudagraphs fall back with one line,
    and the run is the one without them, return for return (same seed)."""
    combinations = [(), ("--compile",), ("--cudagraphs",), ("--compile", "--cudagraphs")]
    by_flags = dict(zip(combinations, tiny_runs(pair, pair.twin, combinations, tmp_path), strict=True))
    assert by_flags[("--cudagraphs",)]["final_return"] == by_flags[()]["final_return"]
    assert by_flags[("--compile", "--cudagraphs")]["final_return"] == by_flags[("--compile",)]["final_return"]
    if "bf16" not in pair.twin_only:
        return
    # --bf16 on the CPU: on one that computes bf16 faster than fp32 (AMX, AVX512-BF16) it is on, recorded, and says
    # nothing; elsewhere one line says it is off, and the run is the fp32 one, return for return.
    results = tmp_path / "results.jsonl"
    completed = run_script_in_process(pair.twin, *pair.tiny.flags, "--seed", "1", "--results-path", results, "--bf16",
                                      env=pair.tiny.env)  # fmt: skip
    assert completed.returncode == 0 and "Traceback" not in completed.stderr, describe(completed)
    result, mentions = read_results(results)[-1], [line for line in output_lines(completed) if "bf16" in line]
    if run_utils.fast_bf16(torch.device("cpu")):
        assert result["bf16"] is True and not mentions, mentions
    else:
        assert len(mentions) == 1 and "bf16 is off for this run" in mentions[0], mentions
        assert result["bf16"] is False and result["final_return"] == by_flags[()]["final_return"]


@requires_cuda
@pytest.mark.parametrize("pair", [p for p in PAIRS.values() if p.algo != "ppo_atari_distributed"], ids=str)
def test_twin_runs_with_cudagraphs_on_cuda(pair, tmp_path):
    """On CUDA, --cudagraphs are on: recorded as such, no line says they are off, and the run is the one without them
    (same seed, same final return: a captured graph replays the same kernels and draws the same numbers).
    --compile --cudagraphs runs once (each compiled run costs its compile time)."""
    combinations = [(), ("--cudagraphs",), ("--compile", "--cudagraphs")]
    by_flags = dict(zip(combinations, tiny_runs(pair, pair.twin, combinations, tmp_path, cuda=True), strict=True))
    assert by_flags[("--cudagraphs",)]["final_return"] == pytest.approx(by_flags[()]["final_return"], rel=1e-5)


# --- Checkpoints: across the pair, refused, video of the evaluation, signals ---------------------------------------


@pytest.mark.parametrize("pair", PAIRS.values(), ids=str)
def test_checkpoints_load_across_the_pair_and_bad_ones_are_refused(pair, tmp_path, capsys, threads):
    """Each member evaluates the other's checkpoint with the same eval return (same seed), and saves back every entry
    it read unchanged: both read and write one layout, the plain script's. Then each refuses, with exit status 2 and
    one line that says which, to resume a missing, truncated, other-algorithm, other-seed (other-game), or
    other-hyper-parameter checkpoint, or a file that holds no checkpoint."""
    flags = (*pair.flags, "--total-timesteps", pair.across_steps)
    for source, target in ((pair.twin, pair.plain), (pair.plain, pair.twin)):
        results = tmp_path / f"{source}.jsonl"
        run_in_process(source, *flags, "--save-model", "--model-path", tmp_path / f"{source}.pt",
                       "--eval-episodes", "2", "--results-path", results)  # fmt: skip
        run_in_process(target, *flags, "--resume", tmp_path / f"{source}.pt", "--save-model",
                       "--model-path", tmp_path / f"{target}_from_{source}.pt", "--eval-episodes", "2",
                       "--results-path", results)  # fmt: skip
        saved, evaluated = read_results(results)
        assert is_number(saved["eval_return"]), saved
        assert evaluated["eval_return"] == saved["eval_return"], f"{target} evaluating {source}'s checkpoint"
        assert evaluated["steps_done"] == saved["steps_done"], "a finished run resumed trains nothing"
        source_checkpoint = load_checkpoint(tmp_path / f"{source}.pt")
        resaved = load_checkpoint(tmp_path / f"{target}_from_{source}.pt")
        assert resaved.pop("run_seconds") > source_checkpoint.pop("run_seconds"), "the run's clock goes on"
        assert_same_state(resaved, source_checkpoint)

    other_algo, (flag, value) = pair.refused
    other, truncated, tensor = tmp_path / "other.pt", tmp_path / "truncated.pt", tmp_path / "tensor.pt"
    torch.save(load_checkpoint(tmp_path / f"{pair.plain}.pt") | {"algo": other_algo}, other)
    torch.save(torch.zeros(3), tensor)
    capsys.readouterr()  # what the runs printed
    for name in (pair.plain, pair.twin):
        agent = tmp_path / f"{name}.pt"
        truncated.write_bytes(agent.read_bytes()[: agent.stat().st_size // 2])
        cases = [
            (("--resume", tmp_path / "missing.pt"), ["no checkpoint", "missing.pt"]),
            (("--resume", truncated), ["cannot read", "truncated.pt"]),
            (("--resume", other), ["not a", "checkpoint", f"holds {other_algo.replace('_', '-')}"]),
            (("--resume", tensor), ["not a", "checkpoint", "Tensor"]),
            (("--resume", agent, "--seed", "7"), ["seed 7"]),
            (("--resume", agent, flag, value), [flag, "hyper-parameters"]),
            *([(("--resume", agent, "--env-id", "Pong-v5"), ["Breakout-v5", "Pong-v5"])] if pair.tiny.env else []),
        ]
        for case_flags, words in cases:
            check_bad_input_in_process(name, (*flags, *case_flags), words, tmp_path, capsys)


@pytest.mark.parametrize("pair", pairs_with("video"), ids=str)
def test_video_of_the_evaluation(pair, tmp_path):
    """--capture-video: one playable MP4 per evaluation episode beside the checkpoint, a frame per step, the eval
    return that of the frame counts."""
    import imageio.v3 as iio

    flags, env_id, return_of_frames = pair.video
    results = tmp_path / "results.jsonl"
    run_in_process(pair.twin, *flags, "--env-id", env_id, "--save-model", "--model-path", tmp_path / "run" / "agent.pt",
                   "--eval-episodes", "2", "--capture-video", "--results-path", results)  # fmt: skip
    videos = sorted((tmp_path / "run" / "videos").glob("*.mp4"))
    assert [video.name for video in videos] == ["eval-episode-0.mp4", "eval-episode-1.mp4"]
    frames = [iio.imread(video) for video in videos]
    assert all(f.ndim == 4 and f.shape[-1] == 3 and f.max() > 0 for f in frames), [f.shape for f in frames]
    assert read_results(results)[0]["eval_return"] == pytest.approx(sum(return_of_frames(len(f)) for f in frames) / 2)


# A plain script and its twin share the handler and the loop's exit: one signal each.
@pytest.mark.parametrize(
    ("pair", "name", "signum"),
    [
        pytest.param(pair, getattr(pair, kind), signum, id=f"{getattr(pair, kind)}-{signum.name}")
        for pair in PAIRS.values()
        for kind, signum in ((PLAIN, signal.SIGINT), (TWIN, signal.SIGTERM))
        if kind in pair.signals
    ],
)
def test_signal_stops_the_run_with_a_checkpoint(pair, name, signum, tmp_path):
    """SIGINT or SIGTERM to a running script (sent once it steps, its budget out of reach): it stops at the end of a
    step, writes its checkpoint and a results line "interrupted", says so, exits 128 + the signal; then it resumes."""
    total = 10**6
    model, results, stderr_path = tmp_path / "agent.pt", tmp_path / "results.jsonl", tmp_path / "stderr.txt"
    command = [sys.executable, str(script_path(name)), *map(str, pair.flags), "--total-timesteps", str(total),
               "--save-model", "--model-path", str(model), "--results-path", str(results)]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(pair.tiny.env or {})}
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            with time_limit(600, f"waiting for {name} to step"):
                # The progress bar shows steps done: the run is in its loop (PPO's total is rounded to whole rollouts).
                while not re.search(r"\b[1-9]\d*/\d+\b", stderr_path.read_text()):
                    assert process.poll() is None, stderr_path.read_text()
                    time.sleep(0.5)
            process.send_signal(signum)
            stdout, _ = process.communicate(timeout=300)
        finally:
            process.kill()
    error_output = stderr_path.read_text()
    assert process.returncode == 128 + signum, (process.returncode, stdout, error_output[-2000:])
    assert "Traceback" not in error_output + stdout, error_output[-2000:]
    assert f"interrupted by {signal.Signals(signum).name}" in stdout.strip().splitlines()[-1], stdout
    (result,) = read_results(results)
    assert (result["interrupted"], result["cut"], result["model_path"]) == (True, "training", str(model)), result
    assert 0 < result["steps_done"] < total and result["steps_done"] % pair.iteration_steps == 0, result
    checkpoint = load_checkpoint(model)
    assert (checkpoint["global_step"], checkpoint["total_timesteps"]) == (result["steps_done"], total)

    # The resumed run (in this process) ends 50 steps on: the checkpoint is given that budget, as schedules need.
    finish = result["steps_done"] + 50
    torch.save({**checkpoint, "total_timesteps": finish}, model)
    completed = run_script_in_process(name, *pair.flags, "--total-timesteps", finish, "--resume", model,
                                      "--save-model", "--eval-episodes", "1", "--results-path", results,
                                      env=pair.tiny.env)  # fmt: skip
    assert completed.returncode == 0, describe(completed)
    resumed = read_results(results)[-1]
    assert (resumed["interrupted"], resumed["cut"], resumed["model_path"]) == (False, None, str(model)), resumed
    assert resumed["steps_done"] >= finish and is_number(resumed["eval_return"]), resumed


# --- Bad input every script refuses alike (run_utils checks it); each pair's own file tests its own flags ---

RUN_BAD_INPUTS = {
    "negative-seed": (("--seed", "-1"), ("seed", "-1")),
    "checkpoint-every-without-save": (("--checkpoint-every", "1000"), ("checkpoint-every", "save-model")),
    "negative-checkpoint-every": (("--save-model", "--checkpoint-every", "-32"), ("checkpoint-every", ">= 0")),
    "video-without-save": (("--capture-video",), ("capture-video", "save-model")),
    "negative-eval-episodes": (("--save-model", "--eval-episodes", "-1"), ("eval-episodes", ">= 0")),
    "video-without-eval-episodes": (("--save-model", "--capture-video", "--eval-episodes", "0"), ("eval-episodes",)),
}


@pytest.mark.parametrize("case", RUN_BAD_INPUTS)
@pytest.mark.parametrize(("pair", "name"), SCRIPTS)
def test_bad_run_flags_exit_2_with_one_clear_line(pair, name, case, tmp_path, capsys):
    check_bad_input_in_process(name, *RUN_BAD_INPUTS[case], tmp_path, capsys)


# --- SAC and TD3, which take the same run flags: bad input ---------------------------------------------------------

OFF_POLICY = [name for pair in (PAIRS["sac"], PAIRS["td3"]) for name in (pair.plain, pair.twin)]
OFF_POLICY_BAD_INPUTS = {  # on Pendulum-v1 where a case gives no other --env-id
    "unknown-env": (("--env-id", "NoSuchEnv-v0"), ("NoSuchEnv",)),
    "discrete-env": (("--env-id", "CartPole-v1"), ("CartPole-v1",)),
    "zero-steps": (("--total-timesteps", "0"), ("total-timesteps",)),
    "batch-over-buffer": (("--batch-size", "512", "--buffer-size", "256"), ("batch-size", "buffer-size")),
    "zero-envs": (("--num-envs", "0"), ("num-envs",)),
    "zero-gradient-steps": (("--gradient-steps", "0"), ("gradient-steps",)),
    "envs-over-buffer": (("--num-envs", "8", "--buffer-size", "4", "--batch-size", "4"), ("num-envs", "buffer-size")),
    "td3-negative-exploration-noise": (("--exploration-noise", "-0.1"), ("exploration-noise",)),
}


@pytest.mark.parametrize(
    ("name", "case"), [(n, c) for n in OFF_POLICY for c in OFF_POLICY_BAD_INPUTS if n[:3] == "td3" or c[:3] != "td3"]
)
def test_sac_td3_bad_input_exits_2_with_one_clear_line(name, case, tmp_path, capsys):
    flags, words = OFF_POLICY_BAD_INPUTS[case]
    check_bad_input_in_process(name, ("--env-id", "Pendulum-v1", *flags), words, tmp_path, capsys)
