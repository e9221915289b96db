"""benchmarks/speedup_table.py on hand-made results of known medians, and run.sh end to end on fake scripts (the real
scripts' runs of run.sh's tiny budget are test_scripts.py's)."""

import itertools
import json
import os
import re
import shutil
import subprocess
import sys

import matplotlib.image
import pytest
from helpers import REPO_ROOT, RESULT_FIELDS, SCRIPTS_DIR, describe

TOOL = REPO_ROOT / "benchmarks" / "speedup_table.py"
RUN_SH = REPO_ROOT / "run.sh"
VARIANTS = ["plain", "twin", "twin+compile", "twin+cudagraphs", "twin+compile+cudagraphs"]


def result(script, algo, env_id, variant, seed, sps, final_return=-100.0, compile_seconds=1.0, device="cpu"):
    """One results line as a script's --results-path writes it."""
    flags = variant.split("+")[1:]
    return dict(script=f"{script}{'' if variant == 'plain' else '_torchcompile'}.py", algo=algo, env_id=env_id,
                seed=seed, compile="compile" in flags, cudagraphs="cudagraphs" in flags, device=device,
                torch_version="2.13.0", total_timesteps=1000, sps=sps, compile_seconds=compile_seconds,
                wall_seconds=10.0, final_return=final_return)  # fmt: skip


def write_results(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run_tool(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=300)


def markdown_rows(text, heading):
    """[{column: cell}] of the first markdown table under the heading `heading` (of any level) in text."""
    lines = re.split(rf"^#+ {re.escape(heading)}$", text, maxsplit=1, flags=re.MULTILINE)[1].splitlines()
    table = itertools.dropwhile(lambda line: not line.startswith("|"), lines)
    table = itertools.takewhile(lambda line: line.startswith("|"), table)
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    return [dict(zip(header, row, strict=True)) for row in rows]


def markdown_table(text, title):
    """{(algorithm, env): {column: cell}} of speedup.md's table under `### title`."""
    return {(row["algorithm"], row["env"]): row for row in markdown_rows(text, title)}


def assert_png(path):
    height, width, _ = matplotlib.image.imread(path).shape  # refuses a file that is not an image
    assert path.read_bytes()[:4] == b"\x89PNG" and height > 200 and width > 200, (path, height, width)


HAND_MADE = [
    # sac: three seeds (medians differ from means), the CPU variants only. sps: 85, 100, 190: 190 / 85 = 2.24.
    *[result("sac_continuous_action", "sac", "HalfCheetah-v5", "plain", seed, sps, ret, cs)
      for seed, sps, ret, cs in [(1, 100.0, -10.0, 0.1), (2, 80.0, 20.0, 0.6), (3, 85.0, 2.0, 0.2)]],
    *[result("sac_continuous_action", "sac", "HalfCheetah-v5", "twin", seed, sps)
      for seed, sps in [(1, 120.0), (2, 90.0), (3, 100.0)]],
    *[result("sac_continuous_action", "sac", "HalfCheetah-v5", "twin+compile", seed, sps, 7.5, cs)
      for seed, sps, cs in [(1, 260.0, 30.0), (2, 180.0, 8.0), (3, 190.0, 9.0)]],
    # td3 on a GPU: two seeds (the median is the mean), every variant; the fastest is both flags: 300 / 60 = 5.
    *[result("td3_continuous_action", "td3", "Pendulum-v1", variant, seed, sps, device="cuda:0")
      for variant, both in [("plain", (50.0, 70.0)), ("twin", (60.0, 60.0)), ("twin+compile", (90.0, 110.0)),
                            ("twin+cudagraphs", (130.0, 170.0)), ("twin+compile+cudagraphs", (290.0, 310.0))]
      for seed, sps in zip((1, 2), both, strict=True)],
    # ppo_continuous: the twin's run too short to measure sps; one of two compiled runs too. 400 / 200 = 2.
    result("ppo_continuous_action", "ppo_continuous", "HalfCheetah-v5", "plain", 1, 200.0, final_return=None),
    result("ppo_continuous_action", "ppo_continuous", "HalfCheetah-v5", "twin", 1, None),
    result("ppo_continuous_action", "ppo_continuous", "HalfCheetah-v5", "twin+compile", 1, 400.0),
    result("ppo_continuous_action", "ppo_continuous", "HalfCheetah-v5", "twin+compile", 2, None),
    # ppo_atari: the plain script's run failed (no line), the twin ran.
    result("ppo_atari_envpool", "ppo_atari", "Breakout-v5", "twin", 1, 300.0),
]  # fmt: skip


def test_tables_have_the_known_medians_ranges_speedups_and_notes(tmp_path):
    """HAND_MADE, with a machine.json and a failed.txt beside the results as run.sh leaves them."""
    machine = dict(cpu="Test CPU 9000", cpu_capability="AVX512", cores=64, gpu="Test GPU", torch="2.13.0",
                   torch_threads=32)  # fmt: skip
    (tmp_path / "machine.json").write_text(json.dumps(machine))
    (tmp_path / "failed.txt").write_text("ppo_atari_envpool plain seed 1: exit 1, log logs/x.log\n")
    completed = run_tool(write_results(tmp_path / "results.jsonl", HAND_MADE), "--out", out := tmp_path / "report")
    assert completed.returncode == 0, describe(completed)
    text = (out / "speedup.md").read_text()
    table, returns = markdown_table(text, "Training speed"), markdown_table(text, "Final return")
    warm_up = markdown_table(text, "Time to the steady state")
    assert list(table) == [("sac", "HalfCheetah-v5"), ("td3", "Pendulum-v1"), ("ppo_continuous", "HalfCheetah-v5"),
                           ("ppo_atari", "Breakout-v5")]  # fmt: skip
    assert table["sac", "HalfCheetah-v5"] == {
        "algorithm": "sac", "env": "HalfCheetah-v5", "steps": "1000", "seeds": "3",
        "plain": "85.0 [80.0, 100.0]", "twin": "100.0 [90.0, 120.0]", "twin+compile": "190.0 [180.0, 260.0]",
        "twin+cudagraphs": "not run", "twin+compile+cudagraphs": "not run", "speed-up": "2.24x (twin+compile)",
    }  # fmt: skip
    td3, ppo, atari = (table[key] for key in list(table)[1:])
    assert [td3[name] for name in VARIANTS] + [td3["seeds"], td3["speed-up"]] == [
        "60.0 [50.0, 70.0]", "60.0", "100.0 [90.0, 110.0]", "150.0 [130.0, 170.0]", "300.0 [290.0, 310.0]", "2",
        "5.00x (twin+compile+cudagraphs)"]  # fmt: skip
    assert [ppo[name] for name in ("plain", "twin", "twin+compile", "speed-up")] == [
        "200.0", "n/a", "400.0, 1x n/a", "2.00x (twin+compile)"]  # fmt: skip
    assert (atari["plain"], atari["twin"], atari["speed-up"]) == ("not run", "300.0", "–")
    sac = "sac", "HalfCheetah-v5"
    assert [returns[sac][name] for name in ("plain", "twin+compile")] == ["2.0 [-10.0, 20.0]", "7.5"]
    assert [warm_up[sac][name] for name in ("plain", "twin+compile")] == ["0.2 [0.1, 0.6]", "9.0 [8.0, 30.0]"]
    assert "speed-up" not in returns[sac] and returns["ppo_continuous", "HalfCheetah-v5"]["plain"] == "n/a"
    assert "Machine: Test CPU 9000 (AVX512), 64 cores (32 torch threads), GPU Test GPU" in text
    assert "torch 2.13.0; runs on device cpu, cuda:0." in text and f"{len(HAND_MADE)} runs, seeds: 1, 2, 3" in text
    notes = text.split("Notes:\n", 1)[1]
    assert "2 run(s) too short to measure sps" in notes
    assert "ppo_continuous twin seed 1" in notes and "ppo_continuous twin+compile seed 2" in notes
    assert "failed, not in the tables: ppo_atari_envpool plain seed 1: exit 1, log logs/x.log" in notes
    assert_png(out / "sps.png")
    assert_png(out / "final_return.png")


def test_defaults_bf16_variant_and_repeated_runs(tmp_path):
    """Without --out, the files go beside the results; without machine.json, this machine is described. A --bf16 run
    is a variant of its own; two runs of a variant and seed are both counted, and a note says so."""
    bf16 = dict(result("pqn_atari_envpool", "pqn_atari", "Breakout-v5", "twin+compile", 1, 600.0), bf16=True)
    repeats = [result("sac_continuous_action", "sac", "Pendulum-v1", "twin", 1, sps) for sps in (10.0, 30.0)]
    rows = [*HAND_MADE[:3], result("pqn_atari_envpool", "pqn_atari", "Breakout-v5", "plain", 1, 300.0), bf16, *repeats]
    completed = run_tool(write_results(tmp_path / "results.jsonl", rows))
    assert completed.returncode == 0, describe(completed)
    text = (tmp_path / "speedup.md").read_text()
    assert f"{os.cpu_count()} cores" in text and "not recorded with the results" in text
    table = markdown_table(text, "Training speed")
    sac, pqn = table["sac", "HalfCheetah-v5"], table["pqn_atari", "Breakout-v5"]
    assert (sac["twin"], sac["twin+compile+bf16"], sac["speed-up"]) == ("not run", "not run", "–")
    assert (pqn["twin+compile+bf16"], pqn["speed-up"]) == ("600.0", "2.00x (twin+compile+bf16)")
    assert table["sac", "Pendulum-v1"]["twin"] == "20.0 [10.0, 30.0]"
    assert "sac on Pendulum-v1, twin, seed 1: 2 runs, all counted" in text and "2 runs, all counted" in completed.stderr
    assert_png(tmp_path / "sps.png")


BAD_RESULTS = {  # the results file's content (None: no file), words of the one line on stderr
    "not-json": (json.dumps(HAND_MADE[0]) + "\nnot json\n", ["line 2", "not a JSON object"]),
    "missing-field": ('{"script": "a.py"}\n', ["line 1", "algo"]),
    "empty": ("\n", ["no results"]),
    "missing-file": (None, ["no results file"]),
}


@pytest.mark.parametrize("case", BAD_RESULTS)
def test_bad_results_file_exits_2_with_one_line(tmp_path, case):
    content, words = BAD_RESULTS[case]
    results = tmp_path / "results.jsonl"
    if content is not None:
        results.write_text(content)
    completed = run_tool(results)
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2 and len(lines) == 1 and all(word in lines[0] for word in words), lines
    assert not (tmp_path / "speedup.md").exists()


# --- run.sh: options, and failures and --bf16 runs on fake scripts ----------------------------------------------


def run_sh(*args, env=None, script=RUN_SH, timeout=900):
    return subprocess.run([str(script), *args], capture_output=True, text=True, cwd=script.parent, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})})  # fmt: skip


BAD_OPTIONS = {  # run.sh's options, environment, words of the one line on stderr
    "unknown": (["--bogus"], {}, ["unknown option", "--bogus"]),
    "no-value": (["--seeds"], {}, ["--seeds needs a value"]),
    "bad-seed": (["--seeds", "1 x"], {}, ["seed", "'x'"]),
    "no-seed": (["--seeds", " "], {}, ["no seeds"]),
    "unknown-script": (["--scripts", "no_such_script"], {}, ["no pair 'no_such_script'", "sac_continuous_action"]),
    "bad-mode": ([], {"LEANRL_MODE": "fast"}, ["LEANRL_MODE", "'fast'"]),
}


@pytest.mark.parametrize("case", BAD_OPTIONS)
def test_bad_option_exits_2_with_one_line(tmp_path, case):
    args, env, words = BAD_OPTIONS[case]
    out = tmp_path / "out"
    completed = run_sh("--out", str(out), *args, env=env)
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2 and len(lines) == 1 and all(word in lines[0] for word in words), lines
    assert completed.stdout == "" and not out.exists(), "a bad option started a run"


# A stand-in for a training script: it writes a results line (sps: 100 + seed, doubled with --compile, tripled with
# --bf16) at once, prints the flags it got, and fails on purpose when FAIL_IF holds.
FAKE_SCRIPT = """import json, sys
argv = sys.argv[1:]
seed, compile_, bf16 = int(argv[argv.index("--seed") + 1]), "--compile" in argv, "--bf16" in argv
print("flags:", " ".join(argv))
if {fail_if}:
    sys.exit("fake: broken on purpose")
line = dict(script="{name}", algo="{algo}", env_id="Pendulum-v1", seed=seed, compile=compile_, cudagraphs=False,
            device="cpu", torch_version="0", total_timesteps=300, sps=(100.0 + seed) * (1 + compile_) * (1 + 2 * bf16),
            compile_seconds=1.0, wall_seconds=1.0, final_return=-5.0, bf16=bf16)
with open(argv[argv.index("--results-path") + 1], "a") as f:
    f.write(json.dumps(line) + "\\n")
"""


@pytest.fixture
def fake_repo(tmp_path):
    """run.sh and the table tool beside fake pairs: td3 works; sac's twin fails with --compile; a new pair has no
    budget in run.sh; a twin without its plain script and a plain script alone are no pairs."""
    repo = tmp_path / "repo"
    shutil.copytree(TOOL.parent, repo / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "leanrl").mkdir()
    shutil.copy2(RUN_SH, repo / "run.sh")
    fakes = {"td3_continuous_action": ("td3", "False"), "td3_continuous_action_torchcompile": ("td3", "False"),
             "sac_continuous_action": ("sac", "False"), "sac_continuous_action_torchcompile": ("sac", "compile_"),
             "new_algo": ("new", "False"), "new_algo_torchcompile": ("new", "False"),
             "lonely_torchcompile": ("lonely", "False"), "plain_only": ("plain_only", "False")}  # fmt: skip
    for name, (algo, fail_if) in fakes.items():
        (repo / "leanrl" / f"{name}.py").write_text(FAKE_SCRIPT.format(name=f"{name}.py", algo=algo, fail_if=fail_if))
    # The machine's bf16, as the table tool records it for run.sh: fast where the test says so.
    (repo / "leanrl" / "run_utils.py").write_text("import os\n\n\ndef fast_bf16(device):\n"
                                                  "    return os.environ.get('FAKE_FAST_BF16') == '1'\n")  # fmt: skip
    return repo


def test_run_sh_reports_failed_runs_runs_bf16_where_fast_and_makes_the_table(fake_repo):
    """td3's fake twin declares a --bf16 switch: where bf16 is fast, its compiled variant runs once more with it. Then
    --scripts where bf16 is not fast, and a used --out refused."""
    twin = fake_repo / "leanrl" / "td3_continuous_action_torchcompile.py"
    twin.write_text(twin.read_text() + "\n\nclass Args:\n    bf16: bool = False\n")
    out = fake_repo / "runs" / "fake"
    env = {"LEANRL_MODE": "tiny", "LEANRL_SEEDS": "1 2", "LEANRL_OUT": str(out), "FAKE_FAST_BF16": "1"}
    completed = run_sh(env={**env, "CUDA_VISIBLE_DEVICES": ""}, script=fake_repo / "run.sh", timeout=300)
    assert completed.returncode == 1, describe(completed)

    # Three pairs x three CPU variants (and td3's bf16 one) x two seeds, seed after seed, in the order of the files.
    progress = re.findall(r"^\[(\d+)/(\d+)\] (\S+) (\S+) seed (\d+) \.\.\. (.*)$", completed.stdout, re.MULTILINE)
    assert [(int(n), int(total)) for n, total, *_ in progress] == [(n, 20) for n in range(1, 21)]
    variants = ["plain", "twin", "twin+compile"]
    expected = [(seed, s, v) for seed in "12" for s in ("new_algo", "sac_continuous_action", "td3_continuous_action")
                for v in variants + ["twin+compile+bf16"] * s.startswith("td3")]  # fmt: skip
    assert [(seed, s, v) for _, _, s, v, seed, _ in progress] == expected
    outcome = {(seed, script, variant): text for _, _, script, variant, seed, text in progress}
    assert re.fullmatch(r"204\.0 sps \(\d+ s\)", outcome["2", "td3_continuous_action", "twin+compile"])
    assert outcome["1", "sac_continuous_action", "twin+compile"] == "FAILED (exit 1): fake: broken on purpose"
    assert outcome["1", "new_algo", "plain"] == "FAILED: no tiny budget for new_algo in run.sh's budget table"

    # The report at the end (6 runs of new_algo, 2 of sac's compiled twin), also in failed.txt.
    report = completed.stdout.split("\n\n")[1].splitlines()
    assert report[0] == "8 of 20 runs failed:" and sum("new_algo" in line for line in report) == 6
    sac = "sac_continuous_action"
    assert f"  {sac} twin+compile seed 2: exit 1, log logs/{sac}-twin-compile-seed2.log" in report
    assert (out / "failed.txt").read_text().splitlines() == [line.strip() for line in report[1:]]
    # Every run got the budget flags, its seed and its variant's flags; the failed run's log holds its message.
    log = (out / "logs" / "td3_continuous_action-twin-compile-bf16-seed2.log").read_text()
    assert "--env-id Pendulum-v1 --learning-starts 100 --batch-size 32 --total-timesteps 300 --seed 2" in log
    assert log.split()[-2:] == ["--compile", "--bf16"]
    assert "broken on purpose" in (out / "logs" / "sac_continuous_action-twin-compile-seed1.log").read_text()

    # The table is made of the runs that worked; the failed ones are named under it.
    text = (out / "speedup.md").read_text()
    table = markdown_table(text, "Training speed")
    assert list(table) == [("sac", "Pendulum-v1"), ("td3", "Pendulum-v1")]
    td3, sac = table["td3", "Pendulum-v1"], table["sac", "Pendulum-v1"]
    assert (td3["twin+compile"], td3["twin+compile+bf16"]) == ("203.0 [202.0, 204.0]", "609.0 [606.0, 612.0]")
    assert td3["speed-up"] == "6.00x (twin+compile+bf16)"
    assert (sac["twin+compile"], sac["twin+compile+bf16"], sac["speed-up"]) == ("not run", "not run", "1.00x (twin)")
    assert "failed, not in the tables: sac_continuous_action twin+compile seed 1: exit 1" in text

    completed = run_sh("--tiny", "--scripts", "td3_continuous_action.py", "--out", "td3", script=fake_repo / "run.sh",
                       env={"FAKE_FAST_BF16": "0", "CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
    assert completed.returncode == 0, describe(completed)
    progress = re.findall(r"^\[\d+/3\] (\S+) (\S+) seed 1 \.\.\. \d", completed.stdout, re.MULTILINE)
    assert progress == [("td3_continuous_action", variant) for variant in variants]
    completed = run_sh("--tiny", "--out", "td3", script=fake_repo / "run.sh")
    assert completed.returncode == 2 and "already holds a results.jsonl" in completed.stderr, describe(completed)


def test_run_sh_runs_the_pairs_test_scripts_runs_and_the_table_reads_their_results(monkeypatch):
    """run.sh's pairs are those test_scripts.py runs on run.sh's tiny budget, checking RESULT_FIELDS: with the fakes
    above, they stand for run.sh --tiny on the real scripts."""
    monkeypatch.syspath_prepend(str(TOOL.parent))
    from common import FIELDS
    from test_scripts import PAIRS

    pairs = [twin.name.removesuffix("_torchcompile.py") for twin in SCRIPTS_DIR.glob("*_torchcompile.py")]
    pairs = sorted(pair for pair in pairs if (SCRIPTS_DIR / f"{pair}.py").is_file())  # as run.sh finds them
    assert sorted(pair.plain for pair in PAIRS.values()) == pairs, "a pair that test_scripts.py does not run"
    assert set(FIELDS) <= set(RESULT_FIELDS), "the table reads a field the scripts' results lines need not hold"
