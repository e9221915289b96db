"""Tests of the documentation: a figure lives once, beside its results or curve file, and the pages that quote it quote
it as that file says; every relative link leads somewhere.

- The speed tables of README.md and speed_cpu.md are what `benchmarks/speedup_table.py` makes of the results files
  their section links to (the newest of them for a row that several hold), and the README's headline speed-ups are the
  range of its two tables.
- The peer ratios of README.md and speed_cpu.md are those of `benchmarks/peers.py`'s table (`peers/*.md`) each cites,
  and that table's ratio is the one of the runs recorded beside it (`peers/*.jsonl`); each pair is quoted once.
- The learning figures: no two curve tables (docs/curves/*.md) give the same command at the same step over the same
  window two figures, and each figure of the README's learning table is in the curve table its row links to (same
  env, step, script, window and seeds).
- Every relative link of README.md and docs/**/*.md points to a file or folder that exists, and its #anchor to a
  heading of that page (GitHub's slugs).
- A count the README gives of a page (the lessons of tips.md) is the page's.

No training run: the results files are read, and the table tool runs on them (seconds).
"""

import json
import re
import statistics
import subprocess
import sys

import pytest
from helpers import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
SPEEDUP_TABLE = REPO_ROOT / "benchmarks" / "speedup_table.py"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]

# --- Reading markdown ----------------------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """The page's lines with fenced code blocks emptied (a `#` or `[x](y)` in code is no heading and no link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


def headings(text):
    """[(level, title, line index)] of the page's headings, outside code blocks."""
    return [
        (len(match.group(1)), match.group(2), index)
        for index, line in enumerate(prose_lines(text))
        if (match := HEADING.match(line))
    ]


def section(text, title_start):
    """The lines of the section whose heading starts with title_start, up to the next heading of any level."""
    found = [index for _, title, index in headings(text) if title.startswith(title_start)]
    assert len(found) == 1, f"{len(found)} headings start with {title_start!r}"
    start = found[0]
    ends = [index for _, _, index in headings(text) if index > start]
    return prose_lines(text)[start + 1 : ends[0] if ends else None]


def cells(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def tables(lines):
    """[(header, rows)] of the markdown tables in these lines; a row is its list of cells."""
    found, block = [], []
    for line in [*lines, ""]:
        if line.lstrip().startswith("|"):
            block.append(cells(line))
        elif block:
            if len(block) >= 2 and all(set(cell) <= set("-: ") for cell in block[1]):
                found.append((block[0], block[2:]))
            block = []
    return found


def links(lines):
    """The link targets of these lines, outside code spans (an image's too)."""
    return [target for line in lines for _, target in LINK.findall(CODE_SPAN.sub("", line))]


def slug(title):
    """GitHub's anchor of a heading: its text (a link's text, no markup), lowercase, every character but letters,
    digits, spaces, '-' and '_' dropped, each space a '-'."""
    text = LINK.sub(lambda match: match.group(1), title).lower()
    return "".join(char for char in text if char.isalnum() or char in " -_").replace(" ", "-")


def anchors(path):
    """The anchors of a page's headings; a repeated slug gets -1, -2, ... as GitHub numbers them."""
    seen, found = {}, set()
    for _, title, _ in headings(path.read_text()):
        base = slug(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page):
    """'target: why' for each relative link of the page whose file or #anchor does not exist."""
    problems = []
    for target in links(prose_lines(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not this repository's
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            problems.append(f"{target}: no such file or folder")
        elif anchor and destination.suffix != ".md":
            problems.append(f"{target}: an anchor into a file that is not markdown")
        elif anchor and anchor not in anchors(destination):
            problems.append(f"{target}: no heading of {destination.name} has the anchor #{anchor}")
    return problems


def cited_results(page, lines):
    """The results folders (docs/results/<machine>_<date>/) linked from these lines of a page."""
    folders = []
    for target in links(lines):
        path = (page.parent / target.partition("#")[0]).resolve()
        if path.is_dir() and path.parent == DOCS / "results" and path not in folders:
            folders.append(path)
    return folders


# --- The speed tables: what speedup_table.py makes of the cited results ------------------------------------------


@pytest.fixture(scope="module")
def speedup_tables(tmp_path_factory):
    """results folder -> (header, {(algorithm, env): {column: cell}}) of the sps table speedup_table.py writes for
    its results.jsonl, each folder's made once."""
    made = {}

    def make(folder):
        if folder not in made:
            out = tmp_path_factory.mktemp(folder.name)
            command = [sys.executable, str(SPEEDUP_TABLE), str(folder / "results.jsonl"), "--out", str(out)]
            completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
            assert completed.returncode == 0, completed.stderr
            lines = (out / "speedup.md").read_text().splitlines()
            (header, rows), *_ = tables(lines[lines.index("### Training speed") :])
            made[folder] = header, {(row[0], row[1]): dict(zip(header, row, strict=True)) for row in rows}
        return made[folder]

    return make


def speed_table_problems(page, title_start, speedup_tables, extra_columns=()):
    """How the first table of a page's section differs from the tool's table of the results folders the section
    links to: a row of several folders is the newest folder's (folders are named <machine>_<date>)."""
    lines = section(page.read_text(), title_start)
    folders = sorted(cited_results(page, lines), key=lambda folder: folder.name.rsplit("_", 1)[-1])
    assert folders, f"the section {title_start!r} of {page.name} links to no folder of docs/results/"
    found = tables(lines)
    assert found, f"no table in the section {title_start!r} of {page.name}"
    header, rows = found[0]
    made = {}  # (algorithm, env) -> (folder, {column: cell}); the newest folder last, so it wins
    for folder in folders:
        tool_header, tool_rows = speedup_tables(folder)
        unknown = [column for column in header if column not in tool_header and column not in extra_columns]
        assert not unknown, f"{page.name}'s columns {unknown} are not in the table of {folder.name}"
        made.update({key: (folder, row) for key, row in tool_rows.items()})
    problems = []
    keys = [(row[0], row[1]) for row in rows]
    if sorted(keys) != sorted(made):
        problems.append(f"rows {keys}, the tool's of {[folder.name for folder in folders]}: {list(made)}")
    for row in rows:
        folder, tool_row = made.get((row[0], row[1]), (None, {}))
        for column, cell in zip(header, row, strict=True):
            if column not in extra_columns and tool_row.get(column) != cell:
                where = folder.name if folder else "no folder"
                problems.append(f"{row[0]} {column}: {cell!r}, the tool on {where}: {tool_row.get(column)!r}")
    return problems


@pytest.mark.parametrize(
    "page, title_start, extra_columns",
    [
        (README, "CPU, 2 cores", ()),
        (README, "GPU, one H100", ()),
        (DOCS / "speed_cpu.md", "The table", ("time to steady state, `--compile`",)),
    ],
    ids=["readme-cpu", "readme-gpu", "speed_cpu"],
)
def test_speed_table_is_the_tools_table_of_the_cited_results(page, title_start, extra_columns, speedup_tables):
    assert speed_table_problems(page, title_start, speedup_tables, extra_columns) == []


def test_speed_table_check_catches_a_changed_cell_and_a_missing_row(tmp_path, speedup_tables):
    text = README.read_text().replace("](docs/", f"]({DOCS}/")  # a copy elsewhere, its links to the same docs/
    row = next(line for line in section(text, "CPU, 2 cores") if line.startswith("| dqn |"))
    page = tmp_path / "README.md"
    for mutated in (row.replace(" | 1.17x", " | 1.18x"), None):
        page.write_text(text.replace(row + "\n", "" if mutated is None else mutated + "\n"))
        assert speed_table_problems(page, "CPU, 2 cores", speedup_tables), mutated
    page.write_text(text)
    assert speed_table_problems(page, "CPU, 2 cores", speedup_tables) == []


SPEED_UP_RANGE = re.compile(r"(\d+\.\d+)x to (\d+\.\d+)x")


def headline_problems(text):
    """How the README's headline ranges of speed-ups (its first prose, before the first section: the CPU range, then the
    GPU range) differ from the lowest and highest speed-up of its CPU and GPU tables."""
    intro = " ".join(text.split("\n## ", 1)[0].split())
    stated = SPEED_UP_RANGE.findall(intro)
    if len(stated) != 2:
        return [f"the headline gives {len(stated)} ranges of speed-ups, not a CPU one and a GPU one: {stated}"]
    problems = []
    for title, (low, high) in zip(("CPU, 2 cores", "GPU, one H100"), stated, strict=True):
        (header, rows), *_ = tables(section(text, title))
        ups = [float(row[header.index("speed-up")].split("x")[0]) for row in rows]
        if (low, high) != (f"{min(ups):.2f}", f"{max(ups):.2f}"):
            table = f"{min(ups):.2f}x to {max(ups):.2f}x"
            problems.append(f"headline {low}x to {high}x, the table under {title!r}: {table}")
    return problems


def test_readme_headline_speed_ups_are_its_tables_range():
    assert headline_problems(README.read_text()) == []


def test_headline_check_catches_another_range():
    text = README.read_text()
    (low, high), *_ = SPEED_UP_RANGE.findall(" ".join(text.split("\n## ", 1)[0].split()))
    assert headline_problems(text.replace(f"{low}x to", f"{float(low) - 0.01:.2f}x to", 1))
    assert headline_problems(text.replace(f"{low}x to {high}x", f"{low}x", 1))


# --- The peer ratios: peers.py's tables, and the runs beside them -------------------------------------------------

PEER_NAMES = {"TD3": "td3", "DQN": "dqn", "PPO Atari": "ppo_atari", "PPO continuous": "ppo_continuous", "SAC": "sac"}
RATIO = re.compile(r"\d+\.\d+x")


def peers_table_ratio(path, pair):
    """The ratio peers.py's table at path gives a pair (e.g. '1.15x'): its one row with a ratio (LeanRL's SAC and TD3
    have a failed --compile row, then their eager fallback's)."""
    for header, rows in tables(path.read_text().splitlines()):
        if "pair" in header and "ours / theirs" in header:
            ratios = [row[header.index("ours / theirs")] for row in rows if row[header.index("pair")] == pair]
            ratios = [ratio.strip("*") for ratio in ratios if ratio != "–"]
            assert len(ratios) == 1, f"{path.name}: {len(ratios)} ratios for {pair}"
            return ratios[0]
    raise AssertionError(f"no peers table in {path}")


def peers_runs_ratio(path, pair):
    """The ratio of the medians of the runs recorded in the .jsonl beside a peers table, as peers.py computes it:
    ours with --compile alone, theirs the variant that measured (their fallback where --compile failed)."""
    runs = [json.loads(line) for line in path.with_suffix(".jsonl").read_text().splitlines() if line.strip()]
    runs = [run for run in runs if run["pair"] == pair]
    ours = [run["sps"] for run in runs if (run["side"], run["variant"]) == ("ours", "--compile") and run["sps"]]
    theirs = {}
    for run in runs:
        if run["side"] == "theirs" and run["sps"] is not None:
            theirs.setdefault(run["variant"], []).append(run["sps"])
    assert ours and len(theirs) == 1, f"{path.name}, {pair}: ours {ours}, theirs {theirs}"
    (their_sps,) = theirs.values()
    return f"{statistics.median(ours) / statistics.median(their_sps):.2f}x"


def readme_peer_quotes(text):
    """[(pair, ratio, results path)] of the README's paragraph of peer ratios, and every ratio it holds."""
    start = text.index("\nBeside their peers") + 1
    paragraph = " ".join(text[start:].split("\n\n")[0].split("\n"))
    cleanrl, leanrl = paragraph.split("LeanRL's twins:")
    quotes = []
    for repo, part in (("cleanrl", cleanrl), ("leanrl", leanrl)):
        names = "|".join(sorted(map(re.escape, PEER_NAMES), key=len, reverse=True))
        for name, ratio, target in re.findall(rf"({names}) ({RATIO.pattern}) \(\[results\]\(([^)]+)\)\)", part):
            quotes.append((f"{repo}-{PEER_NAMES[name]}", ratio, README.parent / target))
    return quotes, RATIO.findall(paragraph)


def test_readme_peer_ratios_are_the_peers_tables_it_cites():
    quotes, every_ratio = readme_peer_quotes(README.read_text())
    pairs = [pair for pair, _, _ in quotes]
    assert sorted(pairs) == sorted(set(pairs)), f"a pair quoted twice: {pairs}"
    assert len(every_ratio) == len(quotes), f"ratios without their results file: {every_ratio} against {quotes}"
    assert len(quotes) >= 7, quotes  # CleanRL's TD3, DQN and PPO Atari; LeanRL's PPO Atari, continuous PPO, SAC, TD3
    for pair, ratio, path in quotes:
        assert path.is_file() and path.parent.name == "peers", path
        assert (ratio, ratio) == (peers_table_ratio(path, pair), peers_runs_ratio(path, pair)), (pair, path.name)


def test_speed_cpu_peer_tables_are_the_peers_tables_and_the_readmes():
    text = (DOCS / "speed_cpu.md").read_text()
    quoted = {}
    for repo, title in (("cleanrl", "Against CleanRL's JAX scripts"), ("leanrl", "Against LeanRL's twins")):
        (header, rows), *_ = tables(section(text, title))
        for row in rows:
            pair = f"{repo}-{PEER_NAMES[row[0].split(',')[0]]}"
            ratio = row[header.index("ours / theirs")].strip("*")
            (target,) = links([row[header.index("results")]])
            path = (DOCS / target).resolve()
            assert (ratio, ratio) == (peers_table_ratio(path, pair), peers_runs_ratio(path, pair)), (pair, path)
            quoted[pair] = ratio, path
    readme = {pair: (ratio, path.resolve()) for pair, ratio, path in readme_peer_quotes(README.read_text())[0]}
    assert quoted == readme


def test_peer_ratio_check_catches_another_value_and_a_second_one():
    text = README.read_text()
    (pair, ratio, path), *_ = readme_peer_quotes(text)[0]
    other = f"{float(ratio[:-1]) + 0.01:.2f}x"
    (_, mutated_ratio, _), *_ = readme_peer_quotes(text.replace(f" {ratio} ([results]", f" {other} ([results]", 1))[0]
    assert mutated_ratio == other != peers_table_ratio(path, pair)
    end = text.index(")),", text.index("Beside their peers")) + 2  # after the first quote's link
    quotes, every_ratio = readme_peer_quotes(text[:end] + " (1.30x before)" + text[end:])
    assert len(every_ratio) == len(quotes) + 1


# --- The learning figures: one figure per command and step, and the README's are the curve tables' ------------------

CURVES = DOCS / "curves"
PANEL = re.compile(r"^## (\S+) on (\S+)$")
FIGURE = re.compile(r"(-?\d+\.\d+)(?: ± (\d+\.\d+))?")
SCALE = {"k": 1_000, "M": 1_000_000}


def in_progress(text):
    """Whether a curve table draws a run in progress (a `*_partial` folder, docs/curves/runs_in_progress.md): it is
    drawn again, and checked, once that run has finished."""
    return "_partial " in text or "_partial`" in text


def learning_rows(text):
    """[(env, {column: cell})] of the learning tables of a curve table: those with a run and ours at a step."""
    found, env = [], None
    lines = prose_lines(text)
    for index, line in enumerate(lines):
        if match := PANEL.match(line):
            env = match.group(2)
        elif line.startswith("|") and (index == 0 or not lines[index - 1].startswith("|")):
            (header, rows), *_ = tables(lines[index:]) or [([], [])]
            if {"step", "run", "ours", "per seed", "ours averages"} <= set(header):
                found += [(env, dict(zip(header, row, strict=True))) for row in rows]
    return found


def step_of(cell):
    """A table's step cell ("2,000,000 (end)") as a number."""
    return int(cell.split()[0].replace(",", ""))


def curve_conflicts(paths):
    """'command at step over window: figures' wherever two curve tables (or one) give the same command (the `run`
    column) at the same step over the same window two figures."""
    figures = {}
    for path in paths:
        text = path.read_text()
        if in_progress(text):
            continue
        for _, row in learning_rows(text):
            if not row["ours"].startswith("not reached"):
                key = (row["run"], step_of(row["step"]), row["ours averages"])
                figures.setdefault(key, {}).setdefault(row["ours"], []).append(path.name)
    return [
        f"{run} at {step} over the {window}: {found}"
        for (run, step, window), found in figures.items()
        if len(found) > 1
    ]


def test_one_command_at_one_step_has_one_figure():
    assert curve_conflicts(sorted(CURVES.glob("*.md"))) == []


def curve_table(rows):
    """A made-up curve table of one panel (sac on HalfCheetah-v5): rows of (step, run, ours, per seed, window)."""
    header = "| step | run | ours | per seed | ours averages |"
    lines = ["## sac on HalfCheetah-v5", "", header, "|---|---|---|---|---|"]
    lines += [f"| {step} | `{run}` | {ours} | {seeds} | {window} |" for step, run, ours, seeds, window in rows]
    return "\n".join(lines) + "\n"


def test_conflict_check_catches_two_figures_of_one_command(tmp_path):
    run = "sac_continuous_action_torchcompile.py --compile --total-timesteps 300000"
    first, second = tmp_path / "a.md", tmp_path / "b.md"
    today = ("300,000", run, "9377.7 ± 225.4", "1: 9562.6, 2: 9192.8", "last 20 episodes")
    other = ("300,000 (end)", run, "8696.5 ± 936.2", "1: 7760.3, 2: 9632.7", "last 20 episodes")
    first.write_text(curve_table([today]))
    second.write_text(curve_table([other]))
    assert len(curve_conflicts([first, second])) == 1
    second.write_text(curve_table([today]))
    assert curve_conflicts([first, second]) == []  # the same figure twice is one figure
    second.write_text(curve_table([(*other[:4], "last 100 episodes")]))
    assert curve_conflicts([first, second]) == []  # another window, another measure
    second.write_text(curve_table([other]) + "`docs/curves/pqn_atari_partial`\n")
    assert curve_conflicts([first, second]) == []  # a run in progress: checked once drawn again


def readme_learning_problems(text, root):
    """(problems, figures checked) of the README's learning table: each figure of its twin and plain columns is a row of
    the curve table the row links to (paths relative to root), in the panel of its env, at its budget, of a twin
    (`_torchcompile`, no `--bf16`) or plain run, over the last 100 episodes beside a CleanRL figure at that step and the
    last 20 elsewhere, with the seeds it names; its random policy's score is the table's."""
    (header, rows), *_ = tables(section(text, "Learning"))
    columns = {name: next(i for i, title in enumerate(header) if title.startswith(name)) for name in ("twin", "plain")}
    published = next(i for i, title in enumerate(header) if title.startswith("published"))
    problems, checked = [], 0
    for row in rows:
        target = next(target for target in links([row[-1]]) if target.endswith(".md"))
        table = (root / target).read_text()
        if in_progress(table):
            continue
        env, count, unit = re.fullmatch(r"(\S+), (\d+)([kM])", row[1]).groups()
        budget = int(count) * SCALE[unit]
        cleanrl = re.search(r"CleanRL -?\d+\.\d+ ± \d+\.\d+(?!\d| at )", row[published])
        window = "last 100 episodes" if cleanrl else "last 20 episodes"
        for kind, column in columns.items():
            cell = row[column]
            for score in re.findall(r"random policy: (\d+\.\d+)", cell):
                checked += 1
                if f"A uniformly random policy scores {score} over" not in table:
                    problems.append(f"{row[0]}, {row[1]}: a random policy's {score} is not {target}'s")
            cell = re.sub(r"random policy: \d+\.\d+", "", cell)
            seeds = re.search(r"\((\d+) seeds|\(seed (\d+)", cell)
            for mean, spread in FIGURE.findall(cell):
                checked += 1
                figure = f"{mean} ± {spread}" if spread else mean
                found = [
                    found
                    for found_env, found in learning_rows(table)
                    if found_env == env
                    and step_of(found["step"]) == budget
                    and ("_torchcompile" in found["run"]) == (kind == "twin")
                    and "--bf16" not in found["run"]
                    and found["ours"] == figure
                ]
                where = f"{row[0]}, {row[1]}, {kind} {figure}"
                if not found:
                    problems.append(f"{where}: no such figure in {target}")
                    continue
                if found[0]["ours averages"] != window:
                    problems.append(f"{where}: {target} averages the {found[0]['ours averages']}, not the {window}")
                per_seed = [entry.split(":")[0] for entry in found[0]["per seed"].split(", ")]
                count, seed = seeds.groups() if seeds else (None, None)
                if count and int(count) != len(per_seed) or seed and per_seed != [seed]:
                    problems.append(f"{where}: {seeds.group(0)}) in the README, seeds {per_seed} in {target}")
    return problems, checked


def test_readme_learning_figures_are_the_curve_tables_it_links_to():
    problems, checked = readme_learning_problems(README.read_text(), REPO_ROOT)
    assert problems == []
    assert checked >= 12, checked  # every row but the run in progress, twin and plain


def test_learning_figure_check_catches_another_figure_window_seed_count_and_random_score(tmp_path):
    run = "sac_continuous_action_torchcompile.py --compile --total-timesteps 300000"
    table = curve_table([("300,000", run, "9377.7 ± 225.4", "1: 9562.6, 2: 9192.8", "last 20 episodes")])
    (tmp_path / "sac.md").write_text(table + "\nA uniformly random policy scores 1.45 over 400 games.\n")
    readme = (
        "## Learning\n\n| algorithm | env, budget | twin `--compile` | plain script | published | |\n"
        "|---|---|---|---|---|---|\n| SAC | HalfCheetah-v5, 300k | {twin} | – | {published} | [table](sac.md) |\n"
    )
    good = readme.format(twin="**9377.7 ± 225.4** (2 seeds; a random policy: 1.45)", published="Tianshou 9059 ± 1051")
    assert readme_learning_problems(good, tmp_path) == ([], 2)
    for twin, published in (
        ("**8696.5 ± 936.2** (2 seeds)", "Tianshou 9059 ± 1051"),  # another figure
        ("**9377.7 ± 225.4** (3 seeds)", "Tianshou 9059 ± 1051"),  # another count of seeds
        ("**9377.7 ± 225.4** (2 seeds)", "CleanRL 9634.89 ± 1423.73"),  # beside CleanRL: the last 100 episodes
        ("**9377.7 ± 225.4** (2 seeds; a random policy: 1.58)", "Tianshou 9059 ± 1051"),  # another random score
    ):
        problems, _ = readme_learning_problems(readme.format(twin=twin, published=published), tmp_path)
        assert len(problems) == 1, (twin, problems)
    wrong_env = good.replace("HalfCheetah-v5, 300k", "Hopper-v5, 300k")
    assert readme_learning_problems(wrong_env, tmp_path)[0]


# --- Links and anchors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(REPO_ROOT)) for page in PAGES])
def test_relative_links_lead_to_a_file_and_a_heading(page):
    assert broken_links(page) == []


def test_slugs_are_githubs():
    assert slug("Speed-up table, `./run.sh --quick`, seed 1") == "speed-up-table-runsh---quick-seed-1"
    assert slug("9. `--bf16`: the network in bf16 where the device computes it faster than fp32") == (
        "9---bf16-the-network-in-bf16-where-the-device-computes-it-faster-than-fp32"
    )
    assert slug("Where this SAC differs from CleanRL's") == "where-this-sac-differs-from-cleanrls"


def test_link_check_catches_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## A section, with `code`\n\n```bash\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-section-with-code) [ok](#here) `[not a link](nowhere.md)`\n\n## Here\n\n"
        "[no file](missing.md) [no anchor](other.md#not-a-heading) [no anchor](#there)\n"
    )
    assert [problem.split(":")[0] for problem in broken_links(page)] == [
        "missing.md",
        "other.md#not-a-heading",
        "#there",
    ]


# --- Counts the README gives of a page ----------------------------------------------------------------------------

NUMBERS = {
    word: number
    for number, word in enumerate(
        "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
        "eighteen nineteen twenty".split(),
        start=1,
    )
}


def stated_lessons(readme_text):
    match = re.search(r"\b(\w+) lessons from these pairs", readme_text)
    assert match, "the README no longer counts tips.md's lessons: drop this test"
    word = match.group(1).lower()
    return int(word) if word.isdigit() else NUMBERS[word]


def numbered_items(text):
    return [int(match.group(1)) for line in prose_lines(text) if (match := re.match(r"(\d+)\. ", line))]


def test_readme_counts_the_lessons_of_tips():
    items = numbered_items((DOCS / "tips.md").read_text())
    assert items == list(range(1, len(items) + 1)), items
    assert stated_lessons(README.read_text()) == len(items)


def test_lesson_count_check_catches_another_count_and_a_gap():
    assert stated_lessons("Twelve lessons from these pairs") == 12
    assert stated_lessons("See 14 lessons from these pairs") == 14
    assert numbered_items("1. a\n   more of a\n2. b\n4. c\n") == [1, 2, 4]
