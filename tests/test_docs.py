"""The documentation: pages quote each figure as its results or curve file says, relative links lead somewhere, a count
the README gives of a page is the page's. Each check also runs on a page made wrong, and must find it."""

import functools
import json
import re
import statistics
import subprocess
import sys

import pytest
from helpers import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]

FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """The page's lines with fenced code blocks emptied (a `#` or `[x](y)` in code is no heading and no link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        fence = bool(FENCE.match(line.lstrip()))
        fenced ^= fence
        lines.append("" if fenced or fence else line)
    return lines


def headings(text):
    """[(title, line index)] of the page's headings, outside code blocks."""
    return [(match.group(2), index) for index, line in enumerate(prose_lines(text)) if (match := HEADING.match(line))]


def section(text, title_start):
    """The lines of the section whose heading starts with title_start, up to the next heading of any level."""
    found = [index for title, index in headings(text) if title.startswith(title_start)]
    assert len(found) == 1, f"{len(found)} headings start with {title_start!r}"
    ends = [index for _, index in headings(text) if index > found[0]]
    return prose_lines(text)[found[0] + 1 : ends[0] if ends else None]


def tables(lines):
    """[(header, rows)] of the markdown tables in these lines; a row is its list of cells."""
    found, block = [], []
    for line in [*lines, ""]:
        if line.lstrip().startswith("|"):
            block.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif block:
            if len(block) >= 2 and all(set(cell) <= set("-: ") for cell in block[1]):
                found.append((block[0], block[2:]))
            block = []
    return found


def links(lines):
    """The link targets of these lines, outside code spans (an image's too)."""
    return [target for line in lines for _, target in LINK.findall(CODE_SPAN.sub("", line))]


def anchors(path):
    """GitHub's anchors of a page's headings: a heading's text (a link's text, no markup), lowercase, every character
    but letters, digits, spaces, '-' and '_' dropped, each space a '-'; a repeated one gets -1, -2, ..."""
    seen, found = {}, set()
    for title, _ in headings(path.read_text()):
        text = LINK.sub(lambda match: match.group(1), title).lower()
        base = "".join(char for char in text if char.isalnum() or char in " -_").replace(" ", "-")
        found.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
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


@pytest.fixture(scope="module")
def speedup_tables(tmp_path_factory):
    """results folder -> (header, {(algorithm, env): {column: cell}}) of speedup_table.py's sps table of its results."""

    @functools.cache
    def make(folder):
        out = tmp_path_factory.mktemp(folder.name)
        tool = REPO_ROOT / "benchmarks" / "speedup_table.py"
        command = [sys.executable, str(tool), str(folder / "results.jsonl"), "--out", str(out)]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert completed.returncode == 0, completed.stderr
        lines = (out / "speedup.md").read_text().splitlines()
        (header, rows), *_ = tables(lines[lines.index("### Training speed") :])
        return header, {(row[0], row[1]): dict(zip(header, row, strict=True)) for row in rows}

    return make


def speed_table_problems(speedup_tables, page, title_start, extra_columns=()):
    """How the first table of a page's section differs from the tool's tables of the docs/results/ folders the section
    links to (a row of several folders is the newest's)."""
    lines = section(page.read_text(), title_start)
    folders = dict.fromkeys((page.parent / target.partition("#")[0]).resolve() for target in links(lines))
    folders = [folder for folder in folders if folder.is_dir() and folder.parent == DOCS / "results"]
    folders.sort(key=lambda folder: folder.name.rsplit("_", 1)[-1])  # by date; of one date, as linked
    assert folders, f"the section {title_start!r} of {page.name} links to no folder of docs/results/"
    (header, rows), *_ = tables(lines)
    made = {}  # (algorithm, env) -> (folder, {column: cell}); the newest folder last, so it wins
    for folder in folders:
        tool_header, tool_rows = speedup_tables(folder)
        unknown = [column for column in header if column not in tool_header and column not in extra_columns]
        assert not unknown, f"{page.name}'s columns {unknown} are not in the table of {folder.name}"
        made.update({key: (folder, row) for key, row in tool_rows.items()})
    keys = [(row[0], row[1]) for row in rows]
    problems = [] if sorted(keys) == sorted(made) else [f"rows {keys}, the tool's: {list(made)}"]
    for row in rows:
        folder, tool_row = made.get((row[0], row[1]), (None, {}))
        for column, cell in zip(header, row, strict=True):
            if column not in extra_columns and tool_row.get(column) != cell:
                where = folder.name if folder else "no folder"
                problems.append(f"{row[0]} {column}: {cell!r}, the tool on {where}: {tool_row.get(column)!r}")
    return problems


SPEED_TABLES = {  # the page, the start of its section's title, its columns that are not the tool's
    "readme-cpu": (README, "CPU, 2 cores"),
    "readme-gpu": (README, "GPU, one H100"),
    "speed_cpu": (DOCS / "speed_cpu.md", "The table", ("time to steady state, `--compile`",)),
}


@pytest.mark.parametrize("case", SPEED_TABLES)
def test_speed_table_is_the_tools_table_of_the_cited_results(case, speedup_tables):
    assert speed_table_problems(speedup_tables, *SPEED_TABLES[case]) == []


def test_speed_table_check_catches_a_changed_cell_and_a_missing_row(tmp_path, speedup_tables):
    text = README.read_text().replace("](docs/", f"]({DOCS}/")  # a copy elsewhere, its links to the same docs/
    row = next(line for line in section(text, "CPU, 2 cores") if line.startswith("| dqn |"))
    page = tmp_path / "README.md"
    page.write_text(text)
    assert speed_table_problems(speedup_tables, page, "CPU, 2 cores") == []
    for mutated in (row.replace(" | 1.17x", " | 1.18x"), None):
        page.write_text(text.replace(row + "\n", "" if mutated is None else mutated + "\n"))
        assert speed_table_problems(speedup_tables, page, "CPU, 2 cores"), mutated


SPEED_UP_RANGE = re.compile(r"(\d+\.\d+)x to (\d+\.\d+)x")


def headline_ranges(text):
    """The README's headline ranges of speed-ups (CPU, then GPU), and its CPU and GPU tables' lowest and highest."""
    stated = SPEED_UP_RANGE.findall(" ".join(text.split("\n## ", 1)[0].split()))
    tabled = []
    for title in ("CPU, 2 cores", "GPU, one H100"):
        (header, rows), *_ = tables(section(text, title))
        ups = [float(row[header.index("speed-up")].split("x")[0]) for row in rows]
        tabled.append((f"{min(ups):.2f}", f"{max(ups):.2f}"))
    return stated, tabled


def test_readme_headline_speed_ups_are_its_tables_range():
    text = README.read_text()
    stated, tabled = headline_ranges(text)
    assert stated == tabled, "the headline's ranges, then the tables'"
    low, _ = stated[0]
    stated, tabled = headline_ranges(text.replace(f"{low}x to", f"{float(low) - 0.01:.2f}x to", 1))
    assert stated[0][0] != tabled[0][0], "the check reads the headline"


PEER_NAMES = {"TD3": "td3", "DQN": "dqn", "PPO Atari": "ppo_atari", "PPO continuous": "ppo_continuous", "SAC": "sac"}
RATIO = re.compile(r"\d+\.\d+x")


def peers_table_ratio(path, pair):
    """The ratio of peers.py's table at path for a pair (e.g. '1.15x'): its one row with a ratio."""
    for header, rows in tables(path.read_text().splitlines()):
        if "pair" in header and "ours / theirs" in header:
            ratios = [row[header.index("ours / theirs")] for row in rows if row[header.index("pair")] == pair]
            ratios = [ratio.strip("*") for ratio in ratios if ratio != "–"]
            assert len(ratios) == 1, f"{path.name}: {len(ratios)} ratios for {pair}"
            return ratios[0]
    raise AssertionError(f"no peers table in {path}")


def peers_runs_ratio(path, pair):
    """The ratio of the medians of the runs in the .jsonl beside a peers table: ours with --compile alone, theirs of
    the variant that measured."""
    runs = [json.loads(line) for line in path.with_suffix(".jsonl").read_text().splitlines() if line.strip()]
    runs = [run for run in runs if run["pair"] == pair]
    ours = [run["sps"] for run in runs if (run["side"], run["variant"]) == ("ours", "--compile") and run["sps"]]
    theirs = [run for run in runs if run["side"] == "theirs" and run["sps"] is not None]
    variants = {run["variant"] for run in theirs}
    assert ours and len(variants) == 1, f"{path.name}, {pair}: ours {ours}, theirs {variants}"
    return f"{statistics.median(ours) / statistics.median(run['sps'] for run in theirs):.2f}x"


def readme_peer_quotes(text):
    """[(pair, ratio, results path)] of the README's paragraph of peer ratios, and every ratio it holds."""
    start = text.index("\nBeside their peers") + 1
    paragraph = " ".join(text[start:].split("\n\n")[0].split("\n"))
    cleanrl, leanrl = paragraph.split("LeanRL's twins:")
    names = "|".join(sorted(map(re.escape, PEER_NAMES), key=len, reverse=True))
    quotes = []
    for repo, part in (("cleanrl", cleanrl), ("leanrl", leanrl)):
        for name, ratio, target in re.findall(rf"({names}) ({RATIO.pattern}) \(\[results\]\(([^)]+)\)\)", part):
            quotes.append((f"{repo}-{PEER_NAMES[name]}", ratio, (README.parent / target).resolve()))
    return quotes, RATIO.findall(paragraph)


def test_peer_ratios_are_the_peers_tables_and_the_runs_beside_them():
    """The README and speed_cpu.md quote each pair's ratio once, with its results file: that peers table's ratio, and
    that of the runs recorded beside it."""
    text = README.read_text()
    quotes, every_ratio = readme_peer_quotes(text)
    pairs = [pair for pair, _, _ in quotes]
    assert sorted(pairs) == sorted(set(pairs)), f"a pair quoted twice: {pairs}"
    assert len(every_ratio) == len(quotes), f"ratios without their results file: {every_ratio} against {quotes}"
    assert len(quotes) >= 7, quotes  # CleanRL's TD3, DQN and PPO Atari; LeanRL's PPO Atari, continuous PPO, SAC, TD3
    speed_cpu = (DOCS / "speed_cpu.md").read_text()
    quoted = {}
    for repo, title in (("cleanrl", "Against CleanRL's JAX scripts"), ("leanrl", "Against LeanRL's twins")):
        (header, rows), *_ = tables(section(speed_cpu, title))
        for row in rows:
            (target,) = links([row[header.index("results")]])
            pair = f"{repo}-{PEER_NAMES[row[0].split(',')[0]]}"
            quoted[pair] = row[header.index("ours / theirs")].strip("*"), (DOCS / target).resolve()
    assert quoted == {pair: (ratio, path) for pair, ratio, path in quotes}, "speed_cpu.md quotes the README's"
    for pair, ratio, path in quotes:
        assert path.parent.name == "peers", path
        assert (ratio, ratio) == (peers_table_ratio(path, pair), peers_runs_ratio(path, pair)), (pair, path.name)

    # The check reads a changed ratio, and counts a ratio quoted without its results file.
    pair, ratio, path = quotes[0]
    other = f"{float(ratio[:-1]) + 0.01:.2f}x"
    (_, mutated_ratio, _), *_ = readme_peer_quotes(text.replace(f" {ratio} ([results]", f" {other} ([results]", 1))[0]
    assert mutated_ratio == other != peers_table_ratio(path, pair)
    end = text.index(")),", text.index("Beside their peers")) + 2  # after the first quote's link
    quotes, every_ratio = readme_peer_quotes(text[:end] + " (1.30x before)" + text[end:])
    assert len(every_ratio) == len(quotes) + 1


PANEL = re.compile(r"^## (\S+) on (\S+)$")
FIGURE = re.compile(r"(-?\d+\.\d+)(?: ± (\d+\.\d+))?")


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


def curve_conflicts(texts):
    """'run at step over window: figures' wherever curve tables ({name: text}) give one run at one step two figures."""
    figures = {}
    for name, text in texts.items():
        for _, row in learning_rows(text):
            if not row["ours"].startswith("not reached"):
                key = (row["run"], step_of(row["step"]), row["ours averages"])
                figures.setdefault(key, {}).setdefault(row["ours"], []).append(name)
    return [f"{key}: {found}" for key, found in figures.items() if len(found) > 1]


def curve_table(rows):
    """A made-up curve table of one panel (sac on HalfCheetah-v5): rows of (step, run, ours, per seed, window)."""
    lines = ["## sac on HalfCheetah-v5", "", "| step | run | ours | per seed | ours averages |", "|" + "---|" * 5]
    lines += [f"| {step} | `{run}` | {ours} | {seeds} | {window} |" for step, run, ours, seeds, window in rows]
    return "\n".join(lines) + "\n"


SAC_RUN = "sac_continuous_action_torchcompile.py --compile --total-timesteps 300000"
SAC_ROW = ("300,000", SAC_RUN, "9377.7 ± 225.4", "1: 9562.6, 2: 9192.8", "last 20 episodes")


def test_one_command_at_one_step_has_one_figure():
    assert curve_conflicts({path.name: path.read_text() for path in (DOCS / "curves").glob("*.md")}) == []
    other = ("300,000 (end)", SAC_RUN, "8696.5 ± 936.2", "1: 7760.3, 2: 9632.7", "last 20 episodes")
    # another figure conflicts; the same figure twice is one figure; another window is another measure
    for second, conflicts in ((other, 1), (SAC_ROW, 0), ((*other[:4], "last 100 episodes"), 0)):
        assert len(curve_conflicts({"a.md": curve_table([SAC_ROW]), "b.md": curve_table([second])})) == conflicts


def readme_learning_problems(text, root):
    """(problems, figures checked) of the README's learning table: each twin (no --bf16) and plain figure is a row of
    the curve table the row links to, of its env and budget, over the last 100 episodes beside a CleanRL figure at that
    step (else 20), with the seeds it names; its random policy's score is the table's."""
    (header, rows), *_ = tables(section(text, "Learning"))
    column = {re.match(r"\w*", title).group(): index for index, title in enumerate(header)}
    problems, checked = [], 0
    for row in rows:
        target = next(target for target in links([row[-1]]) if target.endswith(".md"))
        table = (root / target).read_text()
        env, count, unit = re.fullmatch(r"(\S+), (\d+)([kM])", row[1]).groups()
        budget = int(count) * {"k": 1_000, "M": 1_000_000}[unit]
        cleanrl = re.search(r"CleanRL -?\d+\.\d+ ± \d+\.\d+(?!\d| at )", row[column["published"]])
        window = "last 100 episodes" if cleanrl else "last 20 episodes"
        figures = {  # (step, a twin's, figure) -> row, in the panel of this env
            (step_of(found["step"]), "_torchcompile" in found["run"], found["ours"]): found
            for found_env, found in learning_rows(table)
            if found_env == env and "--bf16" not in found["run"]
        }
        for kind in ("twin", "plain"):
            cell = row[column[kind]]
            for score in re.findall(r"random policy: (\d+\.\d+)", cell):
                checked += 1
                if f"A uniformly random policy scores {score} over" not in table:
                    problems.append(f"{row[0]}, {row[1]}: a random policy's {score} is not {target}'s")
            cell = re.sub(r"random policy: \d+\.\d+", "", cell)
            seeds = re.search(r"\((\d+) seeds|\(seed (\d+)", cell)
            for mean, spread in FIGURE.findall(cell):
                checked += 1
                figure = f"{mean} ± {spread}" if spread else mean
                found = figures.get((budget, kind == "twin", figure))
                where = f"{row[0]}, {row[1]}, {kind} {figure}"
                if not found:
                    problems.append(f"{where}: no such figure in {target}")
                    continue
                if found["ours averages"] != window:
                    problems.append(f"{where}: {target} averages the {found['ours averages']}, not the {window}")
                per_seed = [entry.split(":")[0] for entry in found["per seed"].split(", ")]
                count, seed = seeds.groups() if seeds else (None, None)
                if count and int(count) != len(per_seed) or seed and per_seed != [seed]:
                    problems.append(f"{where}: {seeds.group(0)}) in the README, seeds {per_seed} in {target}")
    return problems, checked


def test_readme_learning_figures_are_the_curve_tables_it_links_to(tmp_path):
    problems, checked = readme_learning_problems(README.read_text(), REPO_ROOT)
    assert problems == []
    assert checked >= 13, checked  # every row, twin and plain

    random_score = "\nA uniformly random policy scores 1.45 over 400 games.\n"
    (tmp_path / "sac.md").write_text(curve_table([SAC_ROW]) + random_score)
    good = (
        "## Learning\n\n| algorithm | env, budget | twin `--compile` | plain script | published | |\n"
        "|---|---|---|---|---|---|\n"
        "| SAC | HalfCheetah-v5, 300k | **9377.7 ± 225.4** (2 seeds; a random policy: 1.45) | – "
        "| Tianshou 9059 ± 1051 | [table](sac.md) |\n"
    )
    assert readme_learning_problems(good, tmp_path) == ([], 2)
    for old, new in (
        ("9377.7 ± 225.4", "8696.5 ± 936.2"),  # another figure
        ("(2 seeds", "(3 seeds"),  # another count of seeds
        ("Tianshou 9059 ± 1051", "CleanRL 9634.89 ± 1423.73"),  # beside CleanRL: the last 100 episodes
        ("policy: 1.45", "policy: 1.58"),  # another random score
        ("HalfCheetah-v5, 300k", "Hopper-v5, 300k"),  # another env
    ):
        problems, _ = readme_learning_problems(good.replace(old, new), tmp_path)
        assert len(problems) == 1, (new, problems)


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(REPO_ROOT)) for page in PAGES])
def test_relative_links_lead_to_a_file_and_a_heading(page):
    assert broken_links(page) == []


def test_link_check_catches_a_missing_file_and_a_missing_anchor_and_its_anchors_are_githubs(tmp_path):
    (tmp_path / "other.md").write_text(
        "# Title\n\n## Speed-up table, `./run.sh --quick`, seed 1\n\n## Where this SAC differs from CleanRL's\n\n"
        "## 9. `--bf16`: the network in bf16\n\n## Title\n\n```bash\n# not a heading\n```\n"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#speed-up-table-runsh---quick-seed-1) [ok](other.md#where-this-sac-differs-from-cleanrls) "
        "[ok](other.md#9---bf16-the-network-in-bf16) [ok](other.md#title-1) [ok](#here) `[not a link](nowhere.md)`\n\n"
        "## Here\n\n[no file](missing.md) [no anchor](other.md#not-a-heading) [no anchor](#there)\n"
    )
    problems = [problem.split(":")[0] for problem in broken_links(page)]
    assert problems == ["missing.md", "other.md#not-a-heading", "#there"]


NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()


def test_readme_counts_the_lessons_of_tips():
    """The README's count of lessons ("Thirteen lessons from these pairs") is that of tips.md's numbered items."""
    lines = prose_lines((DOCS / "tips.md").read_text())
    items = [int(match.group(1)) for line in lines if (match := re.match(r"(\d+)\. ", line))]
    assert items == list(range(1, len(items) + 1)), items
    stated = re.search(r"\b(\w+) lessons from these pairs", README.read_text())
    assert stated, "the README no longer counts tips.md's lessons: drop this test"
    assert NUMBERS.index(stated.group(1).lower()) == len(items)
