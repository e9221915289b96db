"""benchmarks/peers.py on stand-ins: fake clones of LeanRL and CleanRL whose scripts hold the texts the tool's edits
replace and print set sps as theirs do, beside fake twins of ours."""

import importlib.util
import json
import re
import subprocess
import sys

import pytest
from helpers import REPO_ROOT
from test_speedup_table import markdown_rows

TOOL = REPO_ROOT / "benchmarks" / "peers.py"
sys.path.insert(0, str(TOOL.parent))  # the tool imports common from its folder
_spec = importlib.util.spec_from_file_location("peers_tool", TOOL)
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)  # definitions only: the tool runs under __main__

OURS_SPS = {1: 300.0, 2: 100.0, 3: 200.0}  # median 200
THEIRS_SPS = {1: 50.0, 2: 100.0, 3: 80.0}  # median 80: ours / theirs 2.50x
DYNAMO_ERROR = "torch._dynamo.exc.InternalTorchDynamoError: NameError: name 'SYNTHETIC_LOCAL' is not defined"

# A peer script: its imports and the texts its edits replace (in a string, so the edited copy runs), then a run that
# logs its arguments and prints its sps as its script does, or fails when fail_if holds.
LOGGED = """import json, sys
argv = sys.argv[1:]
seed = int(argv[argv.index("--seed") + 1])
with open({log!r}, "a") as f:
    f.write(json.dumps([{side!r}, sys.argv[0], argv]) + "\\n")
"""
FAKE_PEER = '''{imports}
EDITED = r"""
{texts}
"""
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
FAKE_OURS = """sps = {ours_sps}[seed] * (2 if "--bf16" in argv else 1)  # bf16: twice fp32's
with open(argv[argv.index("--results-path") + 1], "a") as f:
    f.write(json.dumps(dict(script="{script}", seed=seed, sps=sps, device="cpu")) + "\\n")
"""


@pytest.fixture
def fakes(tmp_path):
    """Fake clones (LeanRL/, cleanrl/) and twins of ours (ours/), their calls logged in calls.jsonl: LeanRL's SAC fails
    with --compile as the real one does; CleanRL's TD3 prints no sps point for seed 2 (a run too short to measure)."""
    log, ours = tmp_path / "calls.jsonl", tmp_path / "ours"
    ours.mkdir()
    for name, peer in peers.PEERS.items():
        clone = tmp_path / {"leanrl": "LeanRL", "cleanrl": "cleanrl"}[peer["repo"]]
        for module in peer.get("modules", ()):
            (clone / module).parent.mkdir(parents=True, exist_ok=True)
            (clone / module).write_text("class ReplayBuffer:\n    pass\n" if module.endswith("buffers.py") else "")
        if "pattern" in peer:  # LeanRL's: their progress bar
            prints = PRINTS["ppo" if "ppo" in name else "sac"]
        else:
            prints = f"SKIP, NO_POINTS = {WARM_UP_POINTS[name]}, {name == 'cleanrl-td3'}\n" + PRINTS["points"]
        (clone / peer["path"]).parent.mkdir(parents=True, exist_ok=True)
        (clone / peer["path"]).write_text((LOGGED + FAKE_PEER).format(
            imports="from cleanrl_utils.buffers import ReplayBuffer" if peer.get("modules") else "",
            texts="".join(edit.old * edit.count + "\n" for edit in peer["edits"]), log=str(log), side="theirs",
            fail_if=name == "leanrl-sac" and '"--compile" in argv', error=DYNAMO_ERROR, theirs_sps=THEIRS_SPS,
            prints=prints))  # fmt: skip
        fake_ours = (LOGGED + FAKE_OURS).format(script=peer["ours"], log=str(log), side="ours", ours_sps=OURS_SPS)
        (ours / peer["ours"]).write_text(fake_ours)
    return tmp_path


def options(fakes, *args):
    """The tool's options for the fakes, then these (later options win)."""
    clones = ["--leanrl", fakes / "LeanRL", "--cleanrl", fakes / "cleanrl", "--ours", fakes / "ours"] if fakes else []
    return list(map(str, [*clones, *(["--out", fakes / "out"] if fakes else []), *args]))


def run_tool(*args, fakes=None):
    command = [sys.executable, str(TOOL), *options(fakes, *args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def calls_of(fakes):
    """[side, script, argv] of each run of a fake, in order."""
    log = fakes / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


PER_SEED, BF16_COLUMN = "per seed: ours / theirs (/ ours --bf16)", "ours --bf16 sps, median (/ theirs)"


def table_rows(text):
    """{(pair, theirs' column): {column: cell}} of peers.md's table of medians."""
    return {(row["pair"], row["theirs"]): row for row in markdown_rows(text, "Our twins beside their peers")}


def test_runs_alternate_with_their_budgets_and_the_table_has_the_known_ratios(fakes):
    """Every pair, seeds 1 2 3, ours and theirs in turn (ours first for odd seeds), one budget for both; LeanRL's SAC
    --compile failing (on purpose) and its eager fallback run at once."""
    completed = run_tool("--seeds", "1 2 3", fakes=fakes)
    assert completed.returncode == 1, completed.stderr[-3000:]
    calls, expected = calls_of(fakes), []
    for index, seed in enumerate((1, 2, 3)):
        for name in peers.PEERS:  # LeanRL's SAC: its fallback runs at once after its failure
            ours, theirs = [("ours", name, seed)], [("theirs", name, seed)] * (1 + (name == "leanrl-sac"))
            expected += ours + theirs if index % 2 == 0 else theirs + ours
    their_pair = {peer["path"]: name for name, peer in peers.PEERS.items()}
    ran = []
    for side, script, argv in calls:
        name = (re.search(r"([\w-]+)-ours-", argv[-1])[1] if side == "ours"
                else next(n for path, n in their_pair.items() if script.endswith(path)))  # fmt: skip
        ran.append((side, name, int(argv[argv.index("--seed") + 1])))
        budget = peers.PEERS[name]["budget"].split()
        allowed = [["--compile"]] if side == "ours" else [[]] if name.startswith("cleanrl") else [["--compile"], []]
        assert argv[: len(budget)] == budget and argv[len(budget) : argv.index("--seed")] in allowed, (side, argv)
    assert ran == expected

    text = (fakes / "out" / "peers.md").read_text()
    rows = table_rows(text)
    assert ("leanrl-ppo_atari", "LeanRL --compile") in rows and len(rows) == len(peers.PEERS) + 1, list(rows)
    for (name, theirs), row in rows.items():
        assert row["ours sps, median"] == "200.0" and row[BF16_COLUMN] == "–", (name, row)  # no twin has --bf16
        if theirs == "LeanRL --compile" and name == "leanrl-sac":
            assert (row["theirs sps, median"], row["ours / theirs"]) == ("failed (3 of 3)", "–"), row
            assert row[PER_SEED] == "1: 300.0 / failed; 2: 100.0 / failed; 3: 200.0 / failed"
        elif name == "cleanrl-td3":  # seed 2 printed no sps point: the median of seeds 1 and 3
            assert (row["theirs sps, median"], row["ours / theirs"]) == ("65.0 (2 of 3 ran)", "**3.08x**"), row
        else:  # the fallback's row too: LeanRL eager (fallback)
            assert (row["theirs sps, median"], row["ours / theirs"]) == ("80.0", "**2.50x**"), (name, row)
            assert row[PER_SEED] == "1: 300.0 / 50.0; 2: 100.0 / 100.0; 3: 200.0 / 80.0", row
    assert ("leanrl-sac", "LeanRL eager (fallback)") in rows
    records = [json.loads(line) for line in (fakes / "out" / "peers.jsonl").read_text().splitlines()]
    assert len(records) == len(calls) and {r["sps"] for r in records if r["side"] == "ours"} == set(OURS_SPS.values())
    dqn = [record["printed_sps"] for record in records if (record["pair"], record["side"]) == ("cleanrl-dqn", "theirs")]
    assert dqn == [7.0, 14.0, 21.0]  # their own figure, kept beside ours

    reason = "exit 1: InternalTorchDynamoError: NameError: name 'SYNTHETIC_LOCAL' is not defined"
    for seed in (1, 2, 3):
        assert f"leanrl-sac theirs --compile seed {seed} ... FAILED ({reason})" in completed.stdout
        assert f"leanrl-sac theirs eager, fallback, seed {seed} ... {THEIRS_SPS[seed]:.1f} sps (" in completed.stdout
    failed = text.split("Failed runs:\n")[1].split("\n\n")[0].splitlines()
    assert f"- leanrl-sac theirs --compile seed 1: {reason} (`logs/leanrl-sac-theirs-compile-seed1.log`)" in failed
    assert any(line.startswith("- cleanrl-td3 theirs jax.jit seed 2: 0 sps points past the warm-up") for line in failed)
    assert len(failed) == 4 and "Traceback" not in completed.stderr, (failed, completed.stderr)


def test_edits_apply_to_copies_and_leave_the_clones_alone(fakes, monkeypatch, capsys):
    """--apply-only: the edited copies, diffs and modules beside them, no run nor import check; a warning line for each
    clone file that is not the version its edits were written against (all but CleanRL's DQN, made so)."""
    sac = fakes.joinpath(*SAC_CLONE)
    sac.write_text("import json\nfrom leanrl_absent_module.data import ReplayBuffer\n" + sac.read_text())
    dqn = fakes / "cleanrl" / peers.PEERS["cleanrl-dqn"]["path"]
    monkeypatch.setitem(peers.PEERS["cleanrl-dqn"], "blob", peers.git_blob(dqn.read_bytes()))
    before = {path: path.read_bytes() for path in fakes.rglob("*.py")}
    monkeypatch.setattr(sys, "argv", [str(TOOL), *options(fakes, "--apply-only")])
    assert peers.main() == 0
    warnings = capsys.readouterr().err.splitlines()
    for name, peer in peers.PEERS.items():
        repo = peers.PEER_REPOS[peer["repo"]][0]
        copy = (fakes / "out" / "peers" / repo / peer["path"]).read_text()
        for edit in peer["edits"]:
            assert copy.count(edit.new) >= edit.count and (edit.old in edit.new or edit.old not in copy), edit.name
        diff = (fakes / "out" / "peers" / repo / (peer["path"] + ".diff")).read_text()
        assert diff.startswith(f"--- {peer['path']}\n+++ {peer['path']} (edited)\n"), diff[:200]
        clone = fakes / {"leanrl": "LeanRL", "cleanrl": "cleanrl"}[peer["repo"]]
        for module in peer.get("modules", ()):  # copied unedited beside the copy, where their runs import it
            assert (fakes / "out" / "peers" / repo / module).read_bytes() == (clone / module).read_bytes(), module
        warning = f"{repo}'s {peer['path']} is not its version at {peer['commit'][:7]}"
        assert sum(warning in line for line in warnings) == (name != "cleanrl-dqn"), (name, warnings)
    assert len(warnings) == len(peers.PEERS) - 1, warnings
    assert {path: path.read_bytes() for path in fakes.rglob("*.py") if path in before} == before
    assert not calls_of(fakes) and not (fakes / "out" / "peers.md").exists()
    script = fakes / "script.py"  # and git's own id of a file
    script.write_bytes(b"print('hi')\n\xc3\xa9\n")
    found = subprocess.run(["git", "hash-object", str(script)], capture_output=True, text=True)
    assert found.returncode != 0 or peers.git_blob(script.read_bytes()) == found.stdout.strip()
    # torchrl, which requirements-peers.txt cannot pin beside our tensordict, is installed as it says
    requirements = (REPO_ROOT / "requirements" / "requirements-peers.txt").read_text()
    assert peers.INSTALL["torchrl"].split(" (")[0] in requirements


def test_categorical_edit_mends_the_reported_error_on_this_torch():
    """LeanRL PPO Atari's lines that make Categorical's logits and probs properties fail its first Categorical on this
    torch (a user's report); the edited lines leave torch's Categorical as it is."""
    edit = next(edit for edit in peers.PEERS["leanrl-ppo_atari"]["edits"] if edit.name == "categorical-properties")
    script = ("import torch\nfrom torch.distributions.categorical import Categorical\n" + edit.old
              + "print(int(Categorical(logits=torch.zeros(3)).sample()) in (0, 1, 2))\n")  # fmt: skip
    broken = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert broken.returncode == 1, broken.stderr
    assert "AttributeError: property of 'Categorical' object has no setter" in broken.stderr, broken.stderr
    mended = subprocess.run([sys.executable, "-c", peers.apply_edits(script, [edit], "the excerpt")],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert mended.returncode == 0 and mended.stdout == "True\n", mended.stderr


@pytest.mark.parametrize("fast", [True, False], ids=["fast-bf16", "no-fast-bf16"])
def test_a_twin_with_bf16_also_runs_with_it_where_bf16_is_fast(fakes, monkeypatch, capsys, fast):
    """In-process, bf16 fast or not: our fake TD3 twin declares a --bf16 switch (as the real one does), our DQN twin
    none; ours with --bf16 prints twice the sps."""
    twin = fakes / "ours" / peers.PEERS["leanrl-td3"]["ours"]
    twin.write_text(twin.read_text() + "\n\nclass Args:\n    bf16: bool = False\n")
    machine = dict(cpu="Fake CPU", cores=2, torch_threads=2, gpu=None, torch="2.13.0", fast_bf16=fast)
    monkeypatch.setattr(peers, "describe_machine", lambda: machine)
    argv = options(fakes, "--pairs", "leanrl-td3 cleanrl-dqn", "--seeds", "1 2 3")
    monkeypatch.setattr(sys, "argv", [str(TOOL), *argv])
    assert peers.main() == 0
    stdout, text = capsys.readouterr().out, (fakes / "out" / "peers.md").read_text()
    expected = []  # per seed, ours with --bf16 right after ours in fp32, numbered as runs of their own
    for index, seed in enumerate(("1", "2", "3")):
        for name, theirs in (("leanrl-td3", [("theirs", "--compile")]), ("cleanrl-dqn", [("theirs", "jax.jit")])):
            ours = [("ours", "--compile")] + [("ours", "--compile --bf16")] * (fast and name == "leanrl-td3")
            expected += [(name, *run, seed) for run in (ours + theirs if index % 2 == 0 else theirs + ours)]
    progress = re.findall(r"^\[(\d+)/(\d+)\] (\S+) (ours|theirs) (.+?) seed (\d+) \.\.\. ", stdout, re.MULTILINE)
    assert [run[2:] for run in progress] == expected
    assert [run[:2] for run in progress] == [(str(n), str(len(expected))) for n in range(1, len(expected) + 1)]
    rows = table_rows(text)
    td3, dqn = rows["leanrl-td3", "LeanRL --compile"], rows["cleanrl-dqn", "CleanRL jax.jit"]
    assert dqn[BF16_COLUMN] == "–" and dqn[PER_SEED] == "1: 300.0 / 50.0; 2: 100.0 / 100.0; 3: 200.0 / 80.0", dqn
    assert td3["ours / theirs"] == "**2.50x**" and td3[BF16_COLUMN] == ("400.0 (**5.00x**)" if fast else "–"), td3
    per_seed = "1: 300.0 / 50.0 / 600.0; 2: 100.0 / 100.0 / 200.0; 3: 200.0 / 80.0 / 400.0" if fast else dqn[PER_SEED]
    assert td3[PER_SEED] == per_seed, td3
    line = "bf16: faster than fp32 here; ours also runs with --bf16 after each seed's fp32 run: leanrl-td3."
    if not fast:
        line = f"bf16: not faster than fp32 here ({peers.FAST_BF16}): no --bf16 runs of ours, its column is –."
    assert line in stdout.splitlines() and line in text.splitlines(), stdout


def test_edited_sps_print_gives_the_points_the_tool_reads(capsys):
    clock = type("Clock", (), {"time": staticmethod(lambda: 12.5), "perf_counter": staticmethod(lambda: 7.25)})
    for indent in (8, 16, 20):
        edit = peers.sps_points(indent)
        assert edit.new.startswith(edit.old)
        exec(edit.new.replace(" " * indent, ""), {"global_step": 3100, "start_time": 0.0, "time": clock})
    printed = capsys.readouterr().out
    assert peers.POINT.findall(printed) == [("3100", "7.250000")] * 3
    assert peers.PRINTED_SPS.findall(printed) == ["248"] * 3


def test_tiny_run_past_timeout_is_killed_and_reported(fakes):
    dqn = fakes / "cleanrl" / peers.PEERS["cleanrl-dqn"]["path"]
    replace_in(dqn, "sps = {", "import time; time.sleep(600)\nsps = {")
    completed = run_tool("--pairs", "cleanrl-dqn", "--seeds", "1", "--timeout", "1", "--tiny", fakes=fakes)
    assert completed.returncode == 1, completed.stderr
    tiny = peers.PEERS["cleanrl-dqn"]["tiny"].split()
    assert [call[0] for call in calls_of(fakes)] == ["ours", "theirs"]
    assert all(call[2][: len(tiny)] == tiny for call in calls_of(fakes))
    assert "cleanrl-dqn theirs jax.jit seed 1 ... FAILED (killed past --timeout 1 s)" in completed.stdout
    rows = table_rows((fakes / "out" / "peers.md").read_text())
    assert rows["cleanrl-dqn", "CleanRL jax.jit"]["theirs sps, median"] == "failed (1 of 1)"


SAC_CLONE = ("LeanRL", peers.PEERS["leanrl-sac"]["path"])
BAD_INPUT = {  # a change to the fakes, the options (after the fakes' but for "no clone option"), the line's words
    "unknown pair": (None, ["--pairs", "leanrl-dqn"], ["no pair 'leanrl-dqn'", "leanrl-sac"]),
    "no pair": (None, ["--pairs", " "], ["no pairs"]),
    "bad seed": (None, ["--seeds", "1 x"], ["seed 'x'"]),
    "seed twice": (None, ["--seeds", "1 1"], ["twice"]),
    "timeout": (None, ["--timeout", "0"], ["--timeout", "> 0"]),
    "unknown option": (None, ["--bogus"], ["unrecognized arguments: --bogus"]),
    "no clone": (None, ["--leanrl", "/no/such/folder"], ["--leanrl /no/such/folder: no such folder"]),
    "used out": (None, ["--pairs", "cleanrl-dqn", "--out", "USED"], ["already holds a peers.jsonl"]),
    "no clone option": (None, ["--pairs", "leanrl-td3 leanrl-sac"],
                        ["leanrl-td3 leanrl-sac need --leanrl PATH, a clone of github.com/meta-pytorch/LeanRL"]),
    "edit text not found": (
        lambda fakes: replace_in(fakes.joinpath(*SAC_CLONE), 'out_keys=["action"])', ""),
        ["--pairs", "leanrl-ppo_atari leanrl-sac"], ["peers.py: error: LeanRL's leanrl/sac_continuous_action_"
        'torchcompile.py (not its version at 6f8728e): edit policy-out-keys finds 0 of `in_keys=["observation"], '
        'out_keys=["action"])`, not 1']),
    "module of their repository missing": (
        lambda fakes: (fakes / "cleanrl" / "cleanrl_utils" / "buffers.py").unlink(), ["--pairs", "cleanrl-dqn"],
        [f"error: no cleanrl_utils/buffers.py in {{fakes}}/cleanrl (a clone of {peers.PEER_REPOS['cleanrl'][1]}?)"]),
    "module not installed": (  # CleanRL's DQN imports the cleanrl_utils copied beside it: not a missing module
        lambda fakes: replace_in(fakes.joinpath(*SAC_CLONE), "import json, sys\n",
                                 "import json, sys\nfrom leanrl_absent_module.data import ReplayBuffer\n"),
        ["--pairs", "cleanrl-dqn leanrl-sac"], ["error: leanrl-sac: their script imports leanrl_absent_module, which "
        "is not installed here: pip install -r requirements/requirements-peers.txt"]),
}  # fmt: skip


def replace_in(path, old, new):
    path.write_text(path.read_text().replace(old, new))


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_exits_2_with_one_line_before_any_run(fakes, case):
    change, args, words = BAD_INPUT[case]
    if change:
        change(fakes)
    (fakes / "used").mkdir()
    (fakes / "used" / "peers.jsonl").write_text("")
    args = [str(fakes / "used") if arg == "USED" else arg for arg in args]
    words = [word.replace("{fakes}", str(fakes)) for word in words]
    completed = run_tool(*args, fakes=None if case == "no clone option" else fakes)
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2 and len(lines) == 1 and all(word in lines[0] for word in words), lines
    assert not (fakes / "out").exists() and not calls_of(fakes)
