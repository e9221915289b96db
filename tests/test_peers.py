"""Tests of benchmarks/peers.py on stand-ins: fake clones of LeanRL and CleanRL, made in tmp_path, whose scripts hold
today's lines of the real scripts around what the tool's edits replace (TODAY) and print sps as the real ones do,
beside fake scripts of ours that write a results line. The sps of each seed are set by the fakes, so the medians and
ratios of the table are known. No real training: each fake run is a Python process that prints and exits.
"""

import importlib.util
import json
import re
import subprocess
import sys

import pytest
from helpers import REPO_ROOT, describe

TOOL = REPO_ROOT / "benchmarks" / "peers.py"
sys.path.insert(0, str(TOOL.parent))  # the tool imports speedup_table from its folder
_spec = importlib.util.spec_from_file_location("peers_tool", TOOL)
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)  # definitions only: the tool runs under __main__

OURS_SPS = {1: 300.0, 2: 100.0, 3: 200.0}  # median 200
THEIRS_SPS = {1: 50.0, 2: 100.0, 3: 80.0}  # median 80: ours / theirs 2.50x
DYNAMO_ERROR = "torch._dynamo.exc.InternalTorchDynamoError: NameError: name 'SYNTHETIC_LOCAL' is not defined"

# Each peer script's lines around the texts its edits replace (and its imports from its repository's root), verbatim
# from the versions PEERS names (LeanRL's main at 760837e, CleanRL's master at fe8d8a0), joined by "...": the edits are
# checked against what a user clones today.
TODAY = {
    "leanrl-ppo_atari": """\
# import gymnasium as gym
import gym
...
# This is a quick fix while waiting for https://github.com/pytorch/pytorch/pull/138080 to land
Categorical.logits = property(Categorical.__dict__["logits"].wrapped)
Categorical.probs = property(Categorical.__dict__["probs"].wrapped)
...
        self.num_envs = getattr(env, "num_envs", 1)
...
        observations, rewards, dones, infos = super().step(action)
...
    envs.num_envs = args.num_envs
    envs.single_action_space = envs.action_space
    envs.single_observation_space = envs.observation_space
...
    agent_inference_p.to_module(agent_inference)
...
    next_obs = torch.tensor(envs.reset(), device=device, dtype=torch.uint8)
""",
    "leanrl-ppo_continuous": """\
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))
...
            for info in infos["final_info"]:
                r = float(info["episode"]["r"].reshape(()))
...
        [make_env(args.env_id, i, args.capture_video, run_name, args.gamma) for i in range(args.num_envs)]
    )
...
    agent_inference_p.to_module(agent_inference)
""",
    "leanrl-sac": """\
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, args.seed, 0, args.capture_video, run_name)])
...
    from_module(actor).data.to_module(actor_detach)
    policy = TensorDictModule(actor_detach.get_action, in_keys=["observation"], out_keys=["action"])
...
            for info in infos["final_info"]:
                r = float(info["episode"]["r"])
...
                real_next_obs[idx] = torch.as_tensor(infos["final_observation"][idx], device=device, dtype=torch.float)
""",
    "leanrl-td3": """\
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, args.seed, 0, args.capture_video, run_name)])
...
    from_module(actor).data.to_module(actor_detach)
...
        target_actor_params.to_module(target_actor)
...
        with qnet_params.data[0].to_module(qnet):
...
            for info in infos["final_info"]:
                r = float(info["episode"]["r"].reshape(()))
...
        if "final_observation" in infos:
...
                np.asarray(list(infos["final_observation"][truncations]), dtype=np.float32), device=device, dtype=torch.float
""",  # noqa: E501 (their lines)
    "cleanrl-td3": """\
from cleanrl_utils.buffers import ReplayBuffer
...
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, args.seed, 0, args.capture_video, run_name)])
...
            for info in infos["final_info"]:
...
                real_next_obs[idx] = infos["final_observation"][idx]
...
                print("SPS:", int(global_step / (time.time() - start_time)))
""",
    "cleanrl-dqn": """\
from cleanrl_utils.buffers import ReplayBuffer
...
        [make_env(args.env_id, args.seed + i, i, args.capture_video, run_name) for i in range(args.num_envs)]
    )
...
            for info in infos["final_info"]:
...
                real_next_obs[idx] = infos["final_observation"][idx]
...
                    print("SPS:", int(global_step / (time.time() - start_time)))
""",
    "cleanrl-ppo_atari": """\
import flax.linen as nn
import gym
...
    critic_params: flax.core.FrozenDict
...
    envs.num_envs = args.num_envs
    envs.single_action_space = envs.action_space
    envs.single_observation_space = envs.observation_space
    envs.is_vector_env = True
...
        handle, (next_obs, reward, next_done, info) = step_env(handle, action)
...
            episode_returns=(new_episode_return) * (1 - info["terminated"]) * (1 - info["TimeLimit.truncated"]),
            episode_lengths=(new_episode_length) * (1 - info["terminated"]) * (1 - info["TimeLimit.truncated"]),
...
                info["terminated"] + info["TimeLimit.truncated"], new_episode_return, episode_stats.returned_episode_returns
...
                info["terminated"] + info["TimeLimit.truncated"], new_episode_length, episode_stats.returned_episode_lengths
...
    next_obs = envs.reset()
...
        print("SPS:", int(global_step / (time.time() - start_time)))
""",  # noqa: E501 (their lines)
}

# A peer script: today's lines around every text its edits replace (inside a string, so that the edited copy still
# runs), its imports from its repository's root, then a run that logs its arguments and prints its sps in its script's
# way, or fails when FAIL_IF holds.
FAKE_PEER = '''import json, sys
{imports}
EDITED = r"""
{texts}
"""
argv = sys.argv[1:]
seed = int(argv[argv.index("--seed") + 1])
with open({log!r}, "a") as f:
    f.write(json.dumps(["theirs", sys.argv[0], argv]) + "\\n")
if {fail_if}:
    sys.stderr.write("Traceback (most recent call last):\\n  File \\"x.py\\", line 1\\n{error}\\n\\nfrom user code:\\n"
                     "   File \\"x.py\\", line 2, in update_main\\n\\nSet TORCHDYNAMO_VERBOSE=1 for more\\n")
    sys.exit(1)
sps = {theirs_sps}[seed]
{prints}
'''
# How each kind of peer prints: LeanRL's progress bar (an earlier figure, then the last), CleanRL's "SPS:" counted
# from step 0 and, past `skip` warm-up points, points whose sps is `sps` (what the tool's edit makes it print).
PRINTS = {
    "ppo": 'sys.stderr.write(f"\\r 0/20\\rspeed: {sps / 2: 4.1f} sps, reward avg: 0.01: 9/20\\r"\n'
    '                 f"speed: {sps: 4.1f} sps, reward avg: 0.02,lr:  0.00: 19/20\\r 20/20\\n")',
    "sac": 'sys.stderr.write(f"\\r 0/500\\r{sps / 2: 4.4f} sps, : 200/500\\r{sps: 4.4f} sps, step=300: 500/500\\n")',
    "points": "for step in range(1, SKIP + 1):\n"
    '    print("SPS:", step)\n'
    '    print(f"peers.py: global_step={100 * step} time={float(step):.6f}")\n'
    "for step in (1000, 2000, 3000):\n"
    '    print("SPS:", 7 * seed)\n'
    "    if not (NO_POINTS and seed == 2):\n"
    '        print(f"peers.py: global_step={step} time={100 + step / sps:.6f}")',
}
# The sps points CleanRL's scripts print before their steady state (PPO: its 1st and 2nd iterations compile).
WARM_UP_POINTS = {"cleanrl-td3": 0, "cleanrl-dqn": 0, "cleanrl-ppo_atari": 2}
FAKE_OURS = """import json, sys
argv = sys.argv[1:]
seed = int(argv[argv.index("--seed") + 1])
with open({log!r}, "a") as f:
    f.write(json.dumps(["ours", sys.argv[0], argv]) + "\\n")
sps = {ours_sps}[seed] * (2 if "--bf16" in argv else 1)  # bf16: twice fp32's
with open(argv[argv.index("--results-path") + 1], "a") as f:
    f.write(json.dumps(dict(script="{script}", seed=seed, sps=sps, device="cpu")) + "\\n")
"""


def fake_peer(name, log, fail_if="False", no_points=False):
    peer = peers.PEERS[name]
    imports = "from cleanrl_utils.buffers import ReplayBuffer" if peer.get("modules") else ""
    if peer["sps"] == "points":
        prints = f"SKIP, NO_POINTS = {WARM_UP_POINTS[name]}, {no_points}\n" + PRINTS["points"]
    else:
        prints = PRINTS["ppo" if "ppo" in name else "sac"]
    return FAKE_PEER.format(imports=imports, texts=TODAY[name], log=str(log), fail_if=fail_if, error=DYNAMO_ERROR,
                            theirs_sps=THEIRS_SPS, prints=prints)  # fmt: skip


def make_fakes(folder):
    """Fake clones (LeanRL/, cleanrl/) and a fake leanrl/ of ours (ours/) in folder, their calls logged in
    calls.jsonl: LeanRL's SAC fails with --compile as the real one does; CleanRL's TD3 prints no sps point for seed 2
    (a run too short to measure); CleanRL's TD3 and DQN import the replay buffer of the fake cleanrl_utils/."""
    log = folder / "calls.jsonl"
    for name, peer in peers.PEERS.items():
        clone = folder / {"leanrl": "LeanRL", "cleanrl": "cleanrl"}[peer["repo"]]
        for module in peer.get("modules", ()):
            (clone / module).parent.mkdir(parents=True, exist_ok=True)
            (clone / module).write_text("class ReplayBuffer:\n    pass\n" if module.endswith("buffers.py") else "")
        path = clone / peer["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        fail_if = '"--compile" in argv' if name == "leanrl-sac" else "False"
        path.write_text(fake_peer(name, log, fail_if, no_points=name == "cleanrl-td3"))
        ours = folder / "ours" / peer["ours"]
        ours.parent.mkdir(exist_ok=True)
        ours.write_text(FAKE_OURS.format(script=peer["ours"], log=str(log), ours_sps=OURS_SPS))
    return folder


@pytest.fixture
def fakes(tmp_path):
    return make_fakes(tmp_path)


def run_tool(*args, fakes=None):
    """The tool with these options, after the fakes' (later options win)."""
    command = [sys.executable, str(TOOL)]
    if fakes is not None:
        command += [
            "--leanrl",
            str(fakes / "LeanRL"),
            "--cleanrl",
            str(fakes / "cleanrl"),
            "--ours",
            str(fakes / "ours"),
        ]
        command += ["--out", str(fakes / "out")]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)


PER_SEED, BF16_COLUMN = "per seed: ours / theirs (/ ours --bf16)", "ours --bf16 sps, median (/ theirs)"


def table_rows(text):
    """{(pair, theirs' column): {column: cell}} of peers.md's table of medians."""
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("| pair | budget |")))
    lines = [line for line in lines[start:] if line.startswith("|")]
    lines = lines[: next((i for i, line in enumerate(lines) if line.startswith("| pair | script")), len(lines))]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True)) for line in lines[2:]]
    return {(row["pair"], row["theirs"]): row for row in rows}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The whole tool on the fakes, once for the tests that read it: every pair, seeds 1 2 3."""
    fakes = make_fakes(tmp_path_factory.mktemp("measured"))
    completed = run_tool("--seeds", "1 2 3", fakes=fakes)
    calls = [json.loads(line) for line in (fakes / "calls.jsonl").read_text().splitlines()]
    return completed, fakes / "out", calls


def pair_of(call):
    """The pair a fake's call was for: ours name it in their results file, theirs by their script."""
    side, script, argv = call
    if side == "ours":
        return re.match(r"(.+)-ours-", argv[argv.index("--results-path") + 1].split("/")[-1]).group(1)
    return next(name for name, peer in peers.PEERS.items() if script.endswith(peer["path"]))


def test_runs_alternate_ours_and_theirs_seed_by_seed(measured):
    completed, out, calls = measured
    assert completed.returncode == 1, describe(completed)  # LeanRL's SAC --compile fails (on purpose)
    seen = [(call[0], pair_of(call), int(call[2][call[2].index("--seed") + 1])) for call in calls]
    expected = []
    for index, seed in enumerate((1, 2, 3)):
        for name in peers.PEERS:
            sides = ["ours", "theirs"] if index % 2 == 0 else ["theirs", "ours"]
            if name == "leanrl-sac":  # its --compile run fails, then its fallback runs at once
                sides = [side for side in sides for _ in range(2 if side == "theirs" else 1)]
            expected += [(side, name, seed) for side in sides]
    assert seen == expected


def test_both_sides_get_the_same_budget_and_their_own_flags(measured):
    _, _, calls = measured
    for side, script, argv in calls:
        name = pair_of([side, script, argv])
        budget = peers.PEERS[name]["budget"].split()
        assert argv[: len(budget)] == budget, (name, argv)
        rest = argv[len(budget) :]
        if side == "ours":
            assert rest[:1] == ["--compile"] and rest[1] == "--seed" and rest[3] == "--results-path", rest
        elif name.startswith("leanrl"):
            assert rest[:-2] in (["--compile"], []) and rest[-2] == "--seed", rest  # [] is SAC's fallback
        else:
            assert rest[:-2] == [] and rest[-2] == "--seed", rest


def test_table_has_the_known_medians_and_ratios(measured):
    completed, out, _ = measured
    rows = table_rows((out / "peers.md").read_text())
    assert ("leanrl-ppo_atari", "LeanRL --compile") in rows, list(rows)
    for (name, theirs), row in rows.items():
        assert row["ours sps, median"] == "200.0" and row[BF16_COLUMN] == "–", (name, row)  # no twin has --bf16
        if name == "leanrl-sac" and theirs == "LeanRL --compile":
            assert row["theirs sps, median"] == "failed (3 of 3)" and row["ours / theirs"] == "–", row
            assert row[PER_SEED] == "1: 300.0 / failed; 2: 100.0 / failed; 3: 200.0 / failed"
        elif name == "cleanrl-td3":  # seed 2 printed no sps point: the median of seeds 1 and 3
            assert row["theirs sps, median"] == "65.0 (2 of 3 ran)" and row["ours / theirs"] == "**3.08x**", row
        else:
            assert row["theirs sps, median"] == "80.0" and row["ours / theirs"] == "**2.50x**", (name, row)
            assert row[PER_SEED] == "1: 300.0 / 50.0; 2: 100.0 / 100.0; 3: 200.0 / 80.0", row
    records = [json.loads(line) for line in (out / "peers.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 3 * len(peers.PEERS) + 3  # and SAC's three fallback runs
    assert {record["sps"] for record in records if record["side"] == "ours"} == set(OURS_SPS.values())
    dqn = [record for record in records if record["pair"] == "cleanrl-dqn" and record["side"] == "theirs"]
    assert [record["printed_sps"] for record in dqn] == [7.0, 14.0, 21.0]  # their own figure, kept beside ours


def test_failed_peer_run_is_reported_and_its_fallback_named(measured):
    completed, out, _ = measured
    assert completed.returncode == 1, describe(completed)
    reason = "exit 1: InternalTorchDynamoError: NameError: name 'SYNTHETIC_LOCAL' is not defined"
    for seed in (1, 2, 3):
        assert re.search(
            rf"leanrl-sac theirs --compile seed {seed} \.\.\. FAILED \({re.escape(reason)}\)", completed.stdout
        )
        assert f"leanrl-sac theirs eager, fallback, seed {seed} ... {THEIRS_SPS[seed]:.1f} sps (" in completed.stdout
    text = (out / "peers.md").read_text()
    rows = table_rows(text)
    fallback = rows["leanrl-sac", "LeanRL eager (fallback)"]
    assert fallback["theirs sps, median"] == "80.0" and fallback["ours / theirs"] == "**2.50x**", fallback
    failed = text.split("Failed runs:\n")[1].split("\n\n")[0].splitlines()
    assert f"- leanrl-sac theirs --compile seed 1: {reason} (`logs/leanrl-sac-theirs-compile-seed1.log`)" in failed
    assert any(line.startswith("- cleanrl-td3 theirs jax.jit seed 2: 0 sps points past the warm-up") for line in failed)
    assert len(failed) == 4, failed
    assert "DYNAMO" not in completed.stderr and "Traceback" not in completed.stderr, completed.stderr


def test_edits_apply_to_copies_and_leave_the_clones_alone(fakes):
    before = {path: path.read_bytes() for path in fakes.rglob("*.py")}
    completed = run_tool("--apply-only", fakes=fakes)
    assert completed.returncode == 0, describe(completed)
    for name, peer in peers.PEERS.items():
        repo = peers.PEER_REPOS[peer["repo"]][0]
        copy = (fakes / "out" / "peers" / repo / peer["path"]).read_text()
        for edit in peer["edits"]:
            assert copy.count(edit.new) >= edit.count, (name, edit.name)
            if edit.old not in edit.new:
                assert edit.old not in copy, (name, edit.name)
        diff = (fakes / "out" / "peers" / repo / (peer["path"] + ".diff")).read_text()
        assert diff.startswith(f"--- {peer['path']}\n+++ {peer['path']} (edited)\n"), diff[:200]
        clone = fakes / {"leanrl": "LeanRL", "cleanrl": "cleanrl"}[peer["repo"]]
        for module in peer.get("modules", ()):  # copied unedited beside the copy, where their runs import it
            assert (fakes / "out" / "peers" / repo / module).read_bytes() == (clone / module).read_bytes(), module
        # the fakes are not the upstream files: one warning line each, naming the commit
        assert f"{repo}'s {peer['path']} is not its version at {peer['commit'][:7]}" in completed.stderr
    assert {path: path.read_bytes() for path in fakes.rglob("*.py") if path in before} == before
    assert not (fakes / "out" / "peers.md").exists() and not (fakes / "out" / "logs").exists()


def test_missing_edit_text_exits_2_with_one_line(fakes):
    sac = fakes / "LeanRL" / peers.PEERS["leanrl-sac"]["path"]
    sac.write_text(sac.read_text().replace('out_keys=["action"])', 'out_keys=["action", "log_prob", "mean"])'))
    completed = run_tool("--pairs", "leanrl-ppo_atari leanrl-sac", fakes=fakes)
    assert completed.returncode == 2, describe(completed)
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "leanrl/sac_continuous_action_torchcompile.py (not its version at 6f8728e)" in lines[0]
    assert 'edit policy-out-keys finds 0 of `in_keys=["observation"], out_keys=["action"])`, not 1' in lines[0]
    assert not (fakes / "out").exists() and not (fakes / "calls.jsonl").exists()


def test_missing_module_of_their_repository_exits_2_with_one_line(fakes):
    (fakes / "cleanrl" / "cleanrl_utils" / "buffers.py").unlink()
    completed = run_tool("--pairs", "cleanrl-dqn", fakes=fakes)
    assert completed.returncode == 2, describe(completed)
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "no cleanrl_utils/buffers.py in " in lines[0], lines
    assert not (fakes / "out").exists() and not (fakes / "calls.jsonl").exists()


def test_module_their_script_imports_and_is_not_installed_exits_2_before_any_run(fakes):
    sac = fakes / "LeanRL" / peers.PEERS["leanrl-sac"]["path"]
    sac.write_text("import json\nfrom leanrl_absent_module.data import ReplayBuffer\n" + sac.read_text())
    completed = run_tool("--pairs", "cleanrl-dqn leanrl-sac", fakes=fakes)
    assert completed.returncode == 2, describe(completed)
    lines = completed.stderr.strip().splitlines()
    assert lines[-1].endswith(
        "leanrl-sac: their script imports leanrl_absent_module, which is not installed here: "
        "pip install -r requirements/requirements-peers.txt"
    ), lines
    assert not (fakes / "out").exists() and not (fakes / "calls.jsonl").exists()
    # CleanRL's DQN imports the cleanrl_utils copied beside it: not a missing module; --apply-only runs nothing
    assert run_tool("--pairs", "cleanrl-dqn leanrl-sac", "--apply-only", fakes=fakes).returncode == 0
    # torchrl, which requirements-peers.txt cannot pin beside our tensordict, is installed as it says
    torchrl = peers.INSTALL["torchrl"].split(" (")[0]
    assert torchrl in (REPO_ROOT / "requirements" / "requirements-peers.txt").read_text()


def test_clone_file_at_the_version_written_against_gets_no_warning(fakes, monkeypatch, capsys):
    dqn = fakes / "cleanrl" / peers.PEERS["cleanrl-dqn"]["path"]
    monkeypatch.setitem(peers.PEERS["cleanrl-dqn"], "blob", peers.git_blob(dqn.read_bytes()))
    prepared = peers.prepare(["cleanrl-dqn", "cleanrl-td3"], {"cleanrl": fakes / "cleanrl"})
    assert prepared["cleanrl-dqn"].same and not prepared["cleanrl-td3"].same
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and "cleanrl/td3_continuous_action_jax.py is not its version at 004f8a0" in warnings[0]


def test_categorical_edit_mends_the_reported_error_on_this_torch():
    """A user's report: today's LeanRL PPO Atari makes Categorical's logits and probs properties, and its first
    Categorical then fails on this torch; the edited lines leave torch's Categorical as it is."""
    edit = next(edit for edit in peers.PEERS["leanrl-ppo_atari"]["edits"] if edit.name == "categorical-properties")
    assert edit.old in TODAY["leanrl-ppo_atari"]
    script = (
        "import torch\nfrom torch.distributions.categorical import Categorical\n"
        + edit.old
        + "print(int(Categorical(logits=torch.zeros(3)).sample()) in (0, 1, 2))\n"
    )
    broken = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert broken.returncode == 1, describe(broken)
    assert "AttributeError: property of 'Categorical' object has no setter" in broken.stderr, describe(broken)
    edited = peers.apply_edits(script, [edit], "the excerpt")
    mended = subprocess.run([sys.executable, "-c", edited], capture_output=True, text=True, timeout=300)
    assert mended.returncode == 0 and mended.stdout == "True\n", describe(mended)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-bf16", "no-fast-bf16"])
def test_a_twin_with_bf16_also_runs_with_it_where_bf16_is_fast(fakes, monkeypatch, capsys, fast):
    """The tool in-process, its machine faked (describe_machine's fast_bf16 as the test says): our TD3 twin declares a
    --bf16 switch, as our SAC, TD3 and PPO Atari twins do, our DQN twin none; ours with --bf16 prints twice the sps."""
    twin = fakes / "ours" / peers.PEERS["leanrl-td3"]["ours"]
    twin.write_text(twin.read_text() + "\n\nclass Args:\n    bf16: bool = False\n")
    machine = dict(cpu="Fake CPU", cores=2, torch_threads=2, gpu=None, torch="2.13.0", fast_bf16=fast)
    monkeypatch.setattr(peers, "describe_machine", lambda: machine)
    clones = ["--leanrl", str(fakes / "LeanRL"), "--cleanrl", str(fakes / "cleanrl"), "--ours", str(fakes / "ours")]
    pairs = ["--pairs", "leanrl-td3 cleanrl-dqn", "--seeds", "1 2 3", "--out", str(fakes / "out")]
    monkeypatch.setattr(sys, "argv", [str(TOOL), *clones, *pairs])
    assert peers.main() == 0
    stdout = capsys.readouterr().out

    # Per seed, ours with --bf16 right after ours in fp32, numbered as runs of their own.
    td3_ours = ["--compile", "--compile --bf16"] if fast else ["--compile"]
    expected = []
    for index, seed in enumerate(("1", "2", "3")):
        for name, ours in (("leanrl-td3", td3_ours), ("cleanrl-dqn", ["--compile"])):
            sides = [("ours", flags) for flags in ours]
            theirs = [("theirs", peers.PEERS[name]["theirs"][0][0])]
            expected += [(name, *run, seed) for run in (sides + theirs if index % 2 == 0 else theirs + sides)]
    progress = re.findall(r"^\[(\d+)/(\d+)\] (\S+) (ours|theirs) (.+?) seed (\d+) \.\.\. ", stdout, re.MULTILINE)
    assert [run[2:] for run in progress] == expected
    assert [run[:2] for run in progress] == [(str(n), str(len(expected))) for n in range(1, len(expected) + 1)]
    calls = [json.loads(line) for line in (fakes / "calls.jsonl").read_text().splitlines()]
    budget = peers.PEERS["leanrl-td3"]["budget"].split()
    bf16_calls = [argv[len(budget) :] for _, _, argv in calls if "--bf16" in argv]
    assert len(bf16_calls) == (3 if fast else 0)
    assert all(argv[:3] == ["--compile", "--bf16", "--seed"] and "compile_bf16" in argv[-1] for argv in bf16_calls)

    # Its own column: the median of ours with --bf16 and its ratio to theirs; – where not run.
    text = (fakes / "out" / "peers.md").read_text()
    rows = table_rows(text)
    td3, dqn = rows["leanrl-td3", "LeanRL --compile"], rows["cleanrl-dqn", "CleanRL jax.jit"]
    for row in (td3, dqn):
        assert row["ours sps, median"] == "200.0" and row["ours / theirs"] == "**2.50x**", row
    assert dqn[BF16_COLUMN] == "–" and dqn[PER_SEED] == "1: 300.0 / 50.0; 2: 100.0 / 100.0; 3: 200.0 / 80.0", dqn
    if fast:
        assert td3[BF16_COLUMN] == "400.0 (**5.00x**)", td3
        assert td3[PER_SEED] == "1: 300.0 / 50.0 / 600.0; 2: 100.0 / 100.0 / 200.0; 3: 200.0 / 80.0 / 400.0", td3
        line = "bf16: faster than fp32 here; ours also runs with --bf16 after each seed's fp32 run: leanrl-td3."
    else:
        assert td3[BF16_COLUMN] == "–" and td3[PER_SEED] == dqn[PER_SEED], td3
        line = (
            "bf16: not faster than fp32 here (a CUDA GPU of compute capability 8+, AMX or an AMD CPU's AVX512-BF16): "
            "no --bf16 runs of ours, its column is –."
        )
    assert line in stdout.splitlines() and line in text.splitlines(), stdout


def test_git_blob_is_the_id_git_gives_the_file(tmp_path):
    script = tmp_path / "script.py"
    script.write_bytes(b"print('hi')\n\xc3\xa9\n")
    found = subprocess.run(["git", "hash-object", str(script)], capture_output=True, text=True)
    if found.returncode != 0:
        pytest.skip("no git here")
    assert peers.git_blob(script.read_bytes()) == found.stdout.strip()


def test_edited_sps_print_gives_the_points_the_tool_reads(capsys):
    for indent in (8, 16, 20):
        edit = peers.sps_points(indent)
        assert edit.new.startswith(edit.old)
        fake_time = type("Clock", (), {"time": staticmethod(lambda: 12.5), "perf_counter": staticmethod(lambda: 7.25)})
        exec(edit.new.replace(" " * indent, ""), {"global_step": 3100, "start_time": 0.0, "time": fake_time})
    printed = capsys.readouterr().out
    assert peers.POINT.findall(printed) == [("3100", "7.250000")] * 3
    assert peers.PRINTED_SPS.findall(printed) == ["248"] * 3


def test_failure_reason_is_the_last_error_line():
    text = (
        'step 1\r 50%|#####     | 1/2\nTraceback (most recent call last):\n  File "x.py", line 3\n'
        f'{DYNAMO_ERROR}\n\nfrom user code:\n   File "x.py", line 9, in update_main\n\nSet TORCHDYNAMO_VERBOSE=1\n'
    )
    assert peers.failure_reason(text) == "InternalTorchDynamoError: NameError: name 'SYNTHETIC_LOCAL' is not defined"
    assert peers.failure_reason("something went wrong\n  at the end\n") == "at the end"
    assert peers.failure_reason("") == "no output"


def test_tiny_run_past_timeout_is_killed_and_reported(fakes):
    dqn = fakes / "cleanrl" / peers.PEERS["cleanrl-dqn"]["path"]
    dqn.write_text(dqn.read_text().replace("sps = {", "import time; time.sleep(600)\nsps = {", 1))
    completed = run_tool("--pairs", "cleanrl-dqn", "--seeds", "1", "--timeout", "1", "--tiny", fakes=fakes)
    assert completed.returncode == 1, describe(completed)
    calls = [json.loads(line) for line in (fakes / "calls.jsonl").read_text().splitlines()]
    tiny = peers.PEERS["cleanrl-dqn"]["tiny"].split()
    assert [call[0] for call in calls] == ["ours", "theirs"] and all(call[2][: len(tiny)] == tiny for call in calls)
    assert "cleanrl-dqn theirs jax.jit seed 1 ... FAILED (killed past --timeout 1 s)" in completed.stdout
    rows = table_rows((fakes / "out" / "peers.md").read_text())
    assert rows["cleanrl-dqn", "CleanRL jax.jit"]["theirs sps, median"] == "failed (1 of 1)"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--pairs", "leanrl-dqn"], ["no pair 'leanrl-dqn'", "leanrl-sac"]),
        (["--pairs", " "], ["no pairs"]),
        (["--seeds", "1 x"], ["seed 'x'"]),
        (["--seeds", "1 1"], ["twice"]),
        (["--timeout", "0"], ["--timeout", "> 0"]),
        (["--bogus"], ["unrecognized arguments: --bogus"]),
        (["--leanrl", "/no/such/folder"], ["--leanrl /no/such/folder: no such folder"]),
    ],
    ids=["unknown-pair", "no-pair", "bad-seed", "seed-twice", "timeout", "unknown-option", "no-clone"],
)
def test_bad_option_exits_2_with_one_line(fakes, args, words):
    completed = run_tool(*args, fakes=fakes)  # after the fakes' options: --leanrl here replaces the fake clone's
    assert completed.returncode == 2, describe(completed)
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and all(word in lines[0] for word in words), lines
    assert not (fakes / "out").exists()


def test_missing_clone_option_or_used_out_exits_2(fakes):
    completed = run_tool("--pairs", "leanrl-td3 leanrl-sac", "--ours", str(fakes / "ours"))
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2 and len(lines) == 1, describe(completed)
    assert "leanrl-td3 leanrl-sac need --leanrl PATH, a clone of github.com/meta-pytorch/LeanRL" in lines[0]
    (fakes / "out").mkdir()
    (fakes / "out" / "peers.jsonl").write_text("")
    completed = run_tool("--pairs", "cleanrl-dqn", fakes=fakes)
    assert completed.returncode == 2 and "already holds a peers.jsonl" in completed.stderr, describe(completed)
    assert not (fakes / "calls.jsonl").exists()
