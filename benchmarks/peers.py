"""Our twins beside their peers: LeanRL's _torchcompile scripts and CleanRL's JAX scripts, run on this machine in turn
with ours, with the same budgets, one run at a time; a table of their steady-state sps and the ratios of the medians.
docs/peers.md describes the pairs, the edits, how each sps is read and what is written.

    python benchmarks/peers.py --leanrl ~/LeanRL --cleanrl ~/cleanrl                # every pair, seeds 1 2 3
    python benchmarks/peers.py --leanrl ~/LeanRL --pairs leanrl-sac --seeds 1 --tiny  # minutes: does it run here?
    python benchmarks/peers.py --leanrl ~/LeanRL --cleanrl ~/cleanrl --apply-only   # only write the edited copies

Their scripts (from local clones, never written to) are copied into DIR/peers/ and edited there by the edits of PEERS,
each an exact text replaced (one not found: one line, exit status 2, nothing run), with the modules they import from
their repository's root beside them. Per seed, per pair, our twin and theirs run in turn (ours first for odd seeds),
ours also with --bf16 where the device computes bf16 faster than fp32; a failed run of theirs is followed by its
fallback where PEERS gives one. Writes DIR/peers.md, DIR/peers.jsonl, DIR/logs/. Exit status: 0 when every run ran,
1 when one failed (the table is still written), 2 for a bad option, an edit that does not apply or a missing file or
module of theirs.
"""

import argparse
import ast
import contextlib
import difflib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

from common import FAST_BF16, ROOT, Parser, describe_machine, fail, machine_text, table_head, table_row

PEER_REPOS = {
    "leanrl": ("LeanRL", "github.com/meta-pytorch/LeanRL"),
    "cleanrl": ("CleanRL", "github.com/vwxyzjn/cleanrl"),
}
OURS_FLAGS = "--compile"  # our twin's flags in every pair
# Our twins with a --bf16 switch (their Args declare it, as run.sh greps for it) also run with it, where the device
# computes bf16 faster than fp32 (elsewhere the switch only says that it is off).
BF16 = "--bf16"
BF16_FIELD = re.compile(r"^    bf16: bool", re.MULTILINE)

# An edit of a peer script: `old` must be found exactly `count` times, and each becomes `new`. Why each is made:
# docs/peers.md's table of the edits, by name.
Edit = namedtuple("Edit", "name old new count", defaults=(1,))

ENDED_RETURNS = '            for r in infos["final_info"]["episode"]["r"][infos["final_info"]["_episode"]]:\n'
ENVPOOL_PROPERTIES = (
    "    envs.num_envs = args.num_envs\n    envs.single_action_space = envs.action_space\n"
    "    envs.single_observation_space = envs.observation_space\n"
)
# fmt: off
SAME_STEP_ONE_ENV = Edit("same-step-autoreset", "[make_env(args.env_id, args.seed, 0, args.capture_video, run_name)])",
                         "[make_env(args.env_id, args.seed, 0, args.capture_video, run_name)], "
                         "autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)")
SAME_STEP_N_ENVS = Edit("same-step-autoreset", "for i in range(args.num_envs)]\n    )",
                        "for i in range(args.num_envs)],\n        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,"
                        "\n    )")
FINAL_OBS = Edit("final-obs", 'infos["final_observation"][idx]', 'infos["final_obs"][idx]')
FINAL_INFO_RESHAPED, FINAL_INFO_FLOAT = (
    Edit("final-info-dict",
         f'            for info in infos["final_info"]:\n                r = float(info["episode"]["r"]{reshape})\n',
         ENDED_RETURNS + "                r = float(r)\n")
    for reshape in ('.reshape(())', ''))
FINAL_INFO_ONE_ENV = Edit("final-info-dict", '            for info in infos["final_info"]:\n',
                          '            for info in [infos["final_info"]]:\n')
GYMNASIUM_IMPORT = Edit("gymnasium-import", "\nimport gym\n", "\nimport gymnasium as gym\n")
# fmt: on


def detached(call):
    """The to_module call `call(...)` (its text up to the closing parenthesis) with preserve_module_state=False."""
    return Edit("to_module-detached", call + ")", call + ", preserve_module_state=False)")


# CleanRL's scripts print an sps counted from step 0; this line after it gives each point's global step and clock.
POINT_PRINT = 'print(f"peers.py: global_step={global_step} time={time.perf_counter():.6f}")'
POINT = re.compile(r"^peers\.py: global_step=(\d+) time=(\d+\.\d+)$", re.MULTILINE)
PRINTED_SPS = re.compile(r"^SPS: (\d+)$", re.MULTILINE)


def sps_points(indent):
    old = " " * indent + 'print("SPS:", int(global_step / (time.time() - start_time)))\n'
    return Edit("sps-points", old, old + " " * indent + POINT_PRINT + "\n")


LEANRL_SPS = "its progress bar's last sps"
POINTS_SPS = "between its first sps point past the random warm-up (every 100 steps) and its last"
ATARI = "--env-id Breakout-v5 --total-timesteps 20480"  # 20 iterations: LeanRL's sps is printed at 10 and 20
ATARI_TINY = "--env-id Breakout-v5 --num-envs 2 --num-steps 32 --update-epochs 1 --total-timesteps 640"
MUJOCO = "--env-id HalfCheetah-v5 --learning-starts 1000 --total-timesteps 4000"
MUJOCO_TINY = "--env-id Pendulum-v1 --learning-starts 100 --batch-size 32 --total-timesteps 500"
# CleanRL's TD3 and DQN import their replay buffer from the repository's root (from cleanrl_utils.buffers import ...).
CLEANRL_BUFFERS = ("cleanrl_utils/__init__.py", "cleanrl_utils/buffers.py")
# Each pair: their script (repo, path, the commit the edits were written against and its git blob), our twin, the
# budget flags both get (the measurement's and --tiny's), theirs' variants (label, flags: the first is the
# measurement, the others fallbacks run after it fails), how their sps is read (pattern: the last match in their
# output; else between sps points, past `skip`), the modules of their repository the script imports, and the edits.
# fmt: off
PEERS = {
    "leanrl-ppo_atari": dict(
        repo="leanrl", path="leanrl/ppo_atari_envpool_torchcompile.py",
        commit="9873ce934c3b1d5ffa7d84bb51d7bc390c359ec6", blob="869cbca7ec9955fe103db3d60e77a7ae6c107118",
        ours="ppo_atari_envpool_torchcompile.py", budget=ATARI, tiny=ATARI_TINY, theirs=(("--compile", "--compile"),),
        pattern=r"speed:\s*(\d+\.\d+) sps",
        sps_text=LEANRL_SPS + ": the mean over its last 10 iterations (it restarts its clock every 10)",
        edits=(
            GYMNASIUM_IMPORT,
            Edit("envpool-properties", ENVPOOL_PROPERTIES, ""),
            Edit("wrapper-attribute", '        self.num_envs = getattr(env, "num_envs", 1)\n',
                 '        self.num_envs = getattr(env, "num_envs", 1)\n'
                 "        self.single_action_space = env.single_action_space\n"),
            Edit("five-tuple", "        observations, rewards, dones, infos = super().step(action)\n",
                 "        observations, rewards, terminations, truncations, infos = super().step(action)\n"
                 "        dones = terminations | truncations\n"),
            Edit("reset-info", "torch.tensor(envs.reset(), ", "torch.tensor(envs.reset()[0], "),
            Edit("categorical-properties",
                 "# This is a quick fix while waiting for https://github.com/pytorch/pytorch/pull/138080 to land\n"
                 'Categorical.logits = property(Categorical.__dict__["logits"].wrapped)\n'
                 'Categorical.probs = property(Categorical.__dict__["probs"].wrapped)\n', ""),
            detached("agent_inference_p.to_module(agent_inference"),
        ),
    ),
    "leanrl-ppo_continuous": dict(
        repo="leanrl", path="leanrl/ppo_continuous_action_torchcompile.py",
        commit="6f8728ec4f0243ead5401eb35aafd6ffbb5bb3de", blob="240dd911b6bab5620e193f121ce7f320c9774ee4",
        ours="ppo_continuous_action_torchcompile.py",
        budget="--env-id HalfCheetah-v5 --total-timesteps 40960",  # 20 iterations: their sps is printed at 10 and 20
        tiny="--env-id Pendulum-v1 --num-steps 64 --num-minibatches 2 --update-epochs 1 --total-timesteps 640",
        theirs=(("--compile", "--compile"),), pattern=r"speed:\s*(\d+\.\d+) sps",
        sps_text=LEANRL_SPS + ": the mean since its burn-in",
        edits=(
            SAME_STEP_N_ENVS,
            FINAL_INFO_RESHAPED,
            Edit("transform-observation-space",
                 "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))",
                 "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)"),
            detached("agent_inference_p.to_module(agent_inference"),
        ),
    ),
    "leanrl-sac": dict(
        repo="leanrl", path="leanrl/sac_continuous_action_torchcompile.py",
        commit="6f8728ec4f0243ead5401eb35aafd6ffbb5bb3de", blob="6bf4daa37e2a42cca83f79d94a5b37bb3d1c9eee",
        ours="sac_continuous_action_torchcompile.py", budget=MUJOCO, tiny=MUJOCO_TINY,
        theirs=(("--compile", "--compile"), ("eager", "")), pattern=r"(\d+\.\d{4}) sps, ",
        sps_text=LEANRL_SPS + ": the mean since its burn-in, past the random warm-up",
        edits=(
            SAME_STEP_ONE_ENV,
            FINAL_INFO_FLOAT,
            Edit("final-obs", 'torch.as_tensor(infos["final_observation"][idx], ',
                 'torch.as_tensor(infos["final_obs"][idx], '),
            Edit("policy-out-keys", 'in_keys=["observation"], out_keys=["action"])',
                 'in_keys=["observation"], out_keys=["action", "log_prob", "mean"]).select_out_keys("action")'),
            detached("from_module(actor).data.to_module(actor_detach"),
        ),
    ),
    "leanrl-td3": dict(
        repo="leanrl", path="leanrl/td3_continuous_action_torchcompile.py",
        commit="6f8728ec4f0243ead5401eb35aafd6ffbb5bb3de", blob="e4a614a1eb649004dff0d4fbb596e0b1b1d5bcb8",
        ours="td3_continuous_action_torchcompile.py", budget=MUJOCO, tiny=MUJOCO_TINY,
        theirs=(("--compile", "--compile"), ("eager", "")), pattern=r"(\d+\.\d{4}) sps, ",
        sps_text=LEANRL_SPS + ": the mean since its burn-in, past the random warm-up",
        edits=(
            SAME_STEP_ONE_ENV,
            FINAL_INFO_RESHAPED,
            Edit("final-obs", 'if "final_observation" in infos:', 'if "final_obs" in infos:'),
            Edit("final-obs", 'list(infos["final_observation"][truncations])', 'list(infos["final_obs"][truncations])'),
            detached("from_module(actor).data.to_module(actor_detach"),
            detached("target_actor_params.to_module(target_actor"),
            detached("with qnet_params.data[0].to_module(qnet"),
        ),
    ),
    "cleanrl-td3": dict(
        repo="cleanrl", path="cleanrl/td3_continuous_action_jax.py", commit="004f8a086a892a2a180f4dd332b90d83a968aa7a",
        blob="9daf9f461ce1478ae1157e6d1e9d876bb1bcce25", ours="td3_continuous_action_torchcompile.py",
        budget=MUJOCO, tiny=MUJOCO_TINY, theirs=(("jax.jit", ""),),
        skip=0,  # the first point comes 100 steps after the first update: past the JIT compile
        sps_text=POINTS_SPS, modules=CLEANRL_BUFFERS,
        edits=(SAME_STEP_ONE_ENV, FINAL_INFO_ONE_ENV, FINAL_OBS, sps_points(16)),
    ),
    "cleanrl-dqn": dict(
        repo="cleanrl", path="cleanrl/dqn_jax.py", commit="004f8a086a892a2a180f4dd332b90d83a968aa7a",
        blob="4bda819200ae23344881f84fb86c5a3ff07df1a1", ours="dqn_torchcompile.py",
        budget="--env-id CartPole-v1 --learning-starts 10000 --total-timesteps 30000",
        tiny="--env-id CartPole-v1 --learning-starts 200 --batch-size 32 --total-timesteps 600",
        theirs=(("jax.jit", ""),),
        skip=0,  # the first point comes 90 steps after the first update: past the JIT compile
        sps_text=POINTS_SPS, modules=CLEANRL_BUFFERS,
        edits=(SAME_STEP_N_ENVS, FINAL_INFO_ONE_ENV, FINAL_OBS, sps_points(20)),
    ),
    "cleanrl-ppo_atari": dict(
        repo="cleanrl", path="cleanrl/ppo_atari_envpool_xla_jax.py", commit="35896b1fefa9898b904f7e09bcbe6e168e15d2a9",
        blob="8e7da71f5431857c522ab0fedd15bb2bd80d8269", ours="ppo_atari_envpool_torchcompile.py", budget=ATARI,
        tiny=ATARI_TINY, theirs=(("jax.jit", ""),),
        skip=2,  # from the end of the 3rd iteration (ours: after 3 burn-in iterations); the 1st and 2nd compile
        sps_text="between the end of its 3rd iteration and of its last (an sps point per iteration)",
        edits=(
            GYMNASIUM_IMPORT,
            Edit("envpool-properties", ENVPOOL_PROPERTIES + "    envs.is_vector_env = True\n", ""),
            Edit("five-tuple", "        handle, (next_obs, reward, next_done, info) = step_env(handle, action)\n",
                 "        handle, (next_obs, reward, next_done, truncated, info) = step_env(handle, action)\n"
                 "        next_done = next_done | truncated\n"),
            Edit("truncated", 'info["TimeLimit.truncated"]', "truncated", 4),
            Edit("reset-info", "    next_obs = envs.reset()\n", "    next_obs, _ = envs.reset()\n"),
            Edit("params-contains", "    critic_params: flax.core.FrozenDict\n",
                 "    critic_params: flax.core.FrozenDict\n\n    def __contains__(self, key):\n        return False\n"),
            sps_points(8),
        ),
    ),
}
# fmt: on


def git_blob(data):
    """The id git gives a file's content: what a clone at any commit can be checked against."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git_head(folder):
    """The commit checked out in a folder's git repository, or None."""
    with contextlib.suppress(OSError):
        found = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True)
        return found.stdout.strip() if found.returncode == 0 else None


def apply_edits(text, edits, where):
    """The text with each edit made, in turn; a user's error (exit status 2) when an edit's text is not found."""
    for edit in edits:
        if (found := text.count(edit.old)) != edit.count:
            fail(f"{where}: edit {edit.name} finds {found} of `{edit.old.strip().splitlines()[0]}`, not {edit.count}")
        text = text.replace(edit.old, edit.new)
    return text


Prepared = namedtuple("Prepared", "edited original same modules")
# How to install a module a peer's script imports, where requirements-peers.txt does not install it.
INSTALL = {"torchrl": "pip install --no-deps torchrl==0.14.1 (apart: see docs/peers.md)"}


def prepare(pairs, clones, check_imports):
    """{pair: Prepared(edited text, the clone's text, whether it is the version written against, {path: the bytes of
    each module it imports from its repository})}; a user's error before any write when a file of theirs is missing,
    an edit does not apply or (check_imports) a module the edited script imports at its top level is not installed
    (the modules of their repository, copied beside it, do count as installed)."""
    prepared = {}
    for name in pairs:
        peer, clone = PEERS[name], clones[PEERS[name]["repo"]]
        repo, url = PEER_REPOS[peer["repo"]]
        for path in (peer["path"], *peer.get("modules", ())):
            if not (clone / path).is_file():
                fail(f"no {path} in {clone} (a clone of {url}?)")
        data = (clone / peer["path"]).read_bytes()
        modules = {path: (clone / path).read_bytes() for path in peer.get("modules", ())}
        same = git_blob(data) == peer["blob"]
        where = f"{repo}'s {peer['path']}" + ("" if same else f" (not its version at {peer['commit'][:7]})")
        prepared[name] = Prepared(apply_edits(data.decode(), peer["edits"], where), data.decode(), same, modules)
    for name, (edited, _, _, modules) in prepared.items() if check_imports else ():
        for node in ast.parse(edited).body:
            dotted = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            dotted += [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for module in [part.split(".")[0] for part in dotted]:
                if module not in {path.split("/")[0] for path in modules} and not importlib.util.find_spec(module):
                    how = INSTALL.get(module, "pip install -r requirements/requirements-peers.txt")
                    fail(f"{name}: their script imports {module}, which is not installed here: {how}")
    for name in [name for name in pairs if not prepared[name].same]:
        peer = PEERS[name]
        print(f"peers.py: warning: {PEER_REPOS[peer['repo']][0]}'s {peer['path']} is not its version at "
              f"{peer['commit'][:7]}, which the edits were written against; each edit found its text",
              file=sys.stderr)  # fmt: skip
    return prepared


def write_copies(prepared, out):
    """Each edited script into OUT/peers/<repo>/<path>, its diff beside it, and the modules it imports from its
    repository (unedited) at their paths in OUT/peers/<repo>/; {pair: the copy's path}."""
    copies = {}
    for name, (edited, original, _, modules) in prepared.items():
        path, root = PEERS[name]["path"], out / "peers" / PEER_REPOS[PEERS[name]["repo"]][0]
        diff = "".join(
            difflib.unified_diff(original.splitlines(True), edited.splitlines(True), path, f"{path} (edited)")
        )
        for file, data in {**modules, path: edited.encode(), f"{path}.diff": diff.encode()}.items():
            (root / file).parent.mkdir(parents=True, exist_ok=True)
            (root / file).write_bytes(data)
        copies[name] = root / path
    return copies


def failure_reason(text):
    """One line for a failed run: the last line of its output that names an error, else its last line."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b", line)]
    line = (errors or lines or ["no output"])[-1]
    return re.sub(r"^(\w+\.)+(?=\w+(Error|Exception))", "", line)[:200]  # torch._dynamo.exc.XError: XError


def their_sps(peer, text):
    """(steady-state sps, the last figure they print themselves, why there is no sps) from a run's output."""
    if "pattern" in peer:
        found = re.findall(peer["pattern"], text)
        if not found:
            return None, None, "no sps in its output (budget too short?)"
        return float(found[-1]), float(found[-1]), None
    printed = PRINTED_SPS.findall(text)
    printed = float(printed[-1]) if printed else None
    points = [(int(step), float(clock)) for step, clock in POINT.findall(text)][peer["skip"] :]
    if len(points) < 2 or points[-1][1] <= points[0][1]:
        return None, printed, f"{len(points)} sps points past the warm-up, 2 needed (budget too short?)"
    (first_step, first_clock), (last_step, last_clock) = points[0], points[-1]
    return (last_step - first_step) / (last_clock - first_clock), printed, None


def run_one(name, side, label, fallback, seed, flags, args, copies, out):
    """One run of ours or theirs, its output in DIR/logs/: its record (sps, or why it failed)."""
    peer = PEERS[name]
    slug = re.sub(r"\W+", "_", label.strip("-"))  # --compile --bf16: compile_bf16; jax.jit: jax_jit
    tag = f"{name}-{side}-{slug}-seed{seed}"
    log, results = out / "logs" / f"{tag}.log", out / "logs" / f"{tag}.json"
    command = [sys.executable, str(args.ours / peer["ours"] if side == "ours" else copies[name]), *flags]
    command += ["--seed", str(seed)] + (["--results-path", str(results)] if side == "ours" else [])
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    if side == "theirs":  # the root of their copies ahead on PYTHONPATH, as a clone installed with pip
        root = out / "peers" / PEER_REPOS[peer["repo"]][0]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    start = time.monotonic()
    with open(log, "w") as output:  # the child leads its own process group: a timeout or Ctrl-C ends its workers too
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=out / "work", env=env,
                                 start_new_session=True)  # fmt: skip
        try:
            status = child.wait(timeout=args.timeout)
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as stopped:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            if isinstance(stopped, KeyboardInterrupt):
                raise
            status = None  # past --timeout
    seconds, text = time.monotonic() - start, log.read_text(errors="replace")
    sps = printed = failed = device = None
    if status is None:
        failed = f"killed past --timeout {args.timeout:g} s"
    elif status != 0:
        failed = f"exit {status}: {failure_reason(text)}"
    elif side == "ours":
        lines = results.read_text().splitlines() if results.is_file() else []
        result = json.loads(lines[-1]) if lines else {}
        sps, device = result.get("sps"), result.get("device")
        if sps is None:
            failed = "no sps in its results line (budget too short?)" if lines else "no results line"
    else:
        sps, printed, failed = their_sps(peer, text)
    return dict(pair=name, side=side, variant=label, fallback=fallback, seed=seed, script=command[1],
                command=shlex.join(command), returncode=status, seconds=round(seconds, 1), sps=sps,
                printed_sps=printed, device=device, failed=failed, log=str(log.relative_to(out)))  # fmt: skip


def plan_runs(pairs, seeds, bf16_pairs):
    """The runs in their order, each (seed, pair, side, variants): per seed, per pair, ours and theirs in turn, ours
    first for the 1st, 3rd, ... seed; ours with --bf16 (bf16_pairs) right after ours in fp32; theirs' variants past the
    first are fallbacks, run after a failure."""
    plan = []
    for index, seed in enumerate(seeds):
        for name in pairs:
            flags = [OURS_FLAGS] + [f"{OURS_FLAGS} {BF16}"] * (name in bf16_pairs)
            ours = [(seed, name, "ours", [(variant, variant)]) for variant in flags]
            theirs = [(seed, name, "theirs", PEERS[name]["theirs"])]
            plan += ours + theirs if index % 2 == 0 else theirs + ours
    return plan


def run_side(name, side, variants, seed, counter, args, copies, out):
    """One run and, after a failure, its fallbacks: the records of the runs made, each also in peers.jsonl."""
    peer = PEERS[name]
    budget = shlex.split(peer["tiny"] if args.tiny else peer["budget"])
    records = []
    for attempt, (label, flags) in enumerate(variants):
        fallback = attempt > 0
        print(f"{counter} {name} {side} {label}{', fallback,' * fallback} seed {seed} ... ", end="", flush=True)
        record = run_one(name, side, label, fallback, seed, budget + shlex.split(flags), args, copies, out)
        records.append(record)
        with open(out / "peers.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        if not record["failed"]:
            print(f"{record['sps']:.1f} sps ({record['seconds']:.0f} s)")
            break
        print(f"FAILED ({record['failed']})")
    return records


def measured(runs):
    return [run["sps"] for run in runs if run["sps"] is not None]


def median_cell(runs):
    values = measured(runs)
    if not values:
        return f"failed ({len(runs)} of {len(runs)})"
    cell = f"{statistics.median(values):.1f}"
    return cell if len(values) == len(runs) else f"{cell} ({len(values)} of {len(runs)} ran)"


def seed_cell(runs, seed):
    run = next((run for run in runs if run["seed"] == seed), None)
    return "–" if run is None else "failed" if run["sps"] is None else f"{run['sps']:.1f}"


def ratio(ours, theirs):
    """The ratio of the medians of two sets of runs, in bold; – where either has no sps."""
    if not measured(ours) or not measured(theirs):
        return "–"
    return f"**{statistics.median(measured(ours)) / statistics.median(measured(theirs)):.2f}x**"


def bf16_line(machine, switch):
    """One line on our --bf16 runs, for the terminal and the table; switch: the pairs whose twin has the switch."""
    if not machine["fast_bf16"]:
        return f"bf16: not faster than fp32 here ({FAST_BF16}): no {BF16} runs of ours, its column is –."
    if not switch:
        return f"bf16: faster than fp32 here, but none of these pairs' twins has a {BF16} switch."
    return f"bf16: faster than fp32 here; ours also runs with {BF16} after each seed's fp32 run: {', '.join(switch)}."


def report(records, pairs, seeds, args, prepared, clones, machine, switch):
    """The markdown of DIR/peers.md; switch: the pairs whose twin has a --bf16 switch."""
    versions = [f"torch {machine['torch']}"]
    for package in ("jax", "flax", "optax") if any(PEERS[name]["repo"] == "cleanrl" for name in pairs) else ():
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"no {package}")
    devices = sorted({run.get("device") for run in records if run.get("device")})
    runs_on = f"; our runs on {', '.join(devices)}" if devices else ""
    lines = [
        "## Our twins beside their peers",
        "",
        f"Machine: {machine_text(machine)}; {', '.join(versions)}{runs_on}.",
        f"Ours: `{args.ours}`" + (f" at {head[:7]}" if (head := git_head(args.ours)) else "") + ".",
    ]
    for key in sorted({PEERS[name]["repo"] for name in pairs}):
        head = git_head(clones[key])
        lines.append(f"{PEER_REPOS[key][0]}: `{clones[key]}`" + (f", HEAD {head[:7]}" if head else "") + ".")
    tiny = " (--tiny: a check that every script runs, whose sps are no measurement)" if args.tiny else ""
    lines += [
        f"Seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: one run at a time, ours and theirs in "
        f"turn, ours first for the 1st, 3rd, ... seed; the same budget flags for both{tiny}.",
        "sps: ours, our results line's steady-state sps; theirs, as the table of their scripts below says.",
        bf16_line(machine, switch),
        "",
        f"| pair | budget | ours | theirs | ours sps, median | theirs sps, median | ours / theirs "
        f"| ours {BF16} sps, median (/ theirs) | per seed: ours / theirs (/ ours {BF16}) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in pairs:
        peer = PEERS[name]
        budget = peer["tiny"] if args.tiny else peer["budget"]
        runs = [run for run in records if run["pair"] == name]
        ours = [run for run in runs if (run["side"], run["variant"]) == ("ours", OURS_FLAGS)]
        ours_bf16 = [run for run in runs if (run["side"], run["variant"]) == ("ours", f"{OURS_FLAGS} {BF16}")]
        for label, _ in peer["theirs"]:
            theirs = [run for run in runs if (run["side"], run["variant"]) == ("theirs", label)]
            if not theirs:
                continue
            bf16 = "–"
            if ours_bf16:
                bf16_ratio = ratio(ours_bf16, theirs)
                bf16 = median_cell(ours_bf16) + ("" if bf16_ratio == "–" else f" ({bf16_ratio})")
            sides = [ours, theirs] + ([ours_bf16] if ours_bf16 else [])
            ran = [seed for seed in seeds if any(run["seed"] == seed for side in sides for run in side)]
            per_seed = "; ".join(f"{seed}: " + " / ".join(seed_cell(side, seed) for side in sides) for seed in ran)
            fallback = " (fallback)" if any(run["fallback"] for run in theirs) else ""
            cells = f"`{budget}`", f"`{peer['ours']} {OURS_FLAGS}`", f"{PEER_REPOS[peer['repo']][0]} {label}{fallback}"
            medians = median_cell(ours) if ours else "not run", median_cell(theirs), ratio(ours, theirs)
            lines.append(table_row(name, *cells, *medians, bf16, per_seed))
    if failed := [run for run in records if run["failed"]]:
        lines += ["", "Failed runs:"] + [f"- {run['pair']} {run['side']} {run['variant']} seed {run['seed']}: "
                                         f"{run['failed']} (`{run['log']}`)" for run in failed]  # fmt: skip
    lines += ["", "Their scripts, as run (edited copies and diffs in `peers/`):", ""]
    lines += table_head("pair", "script", "written against", "the clone's file", "their sps")
    for name in pairs:
        peer = PEERS[name]
        state = "that version" if prepared[name].same else "**another version** (the edits applied)"
        script = f"{PEER_REPOS[peer['repo']][0]} `{peer['path']}`"
        lines.append(table_row(name, script, peer["commit"][:7], state, peer["sps_text"]))
    lines += ["", "The edits, each an exact text replaced in the copy (docs/peers.md says why):", ""]
    lines += [f"- {name}: {', '.join(dict.fromkeys(edit.name for edit in PEERS[name]['edits']))}" for name in pairs]
    return "\n".join(lines) + "\n"


def parse_args():
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--leanrl", type=Path, metavar="PATH", help="a clone of " + PEER_REPOS["leanrl"][1])
    add("--cleanrl", type=Path, metavar="PATH", help="a clone of " + PEER_REPOS["cleanrl"][1])
    add("--pairs", nargs="+", default=list(PEERS), help="pairs to run (default all): " + " ".join(PEERS))
    add("--seeds", nargs="+", default=["1 2 3"], help='seeds, e.g. "1 2 3" (default)')
    add("--out", type=Path, metavar="DIR", help="where to write (default: runs/peers/<date>_<time>)")
    add("--ours", type=Path, default=ROOT / "leanrl", help="our scripts' folder (default leanrl/)")
    add("--tiny", action="store_true", help="a few hundred steps per run: checks that all runs here")
    add("--timeout", type=float, default=1800.0, help="seconds a run may take (default 1800)")
    add("--apply-only", action="store_true", help="only write the edited copies into DIR/peers/")
    args = parser.parse_args()

    # each given as one quoted string ("1 2 3") or as separate words
    pairs, seeds = list(dict.fromkeys(" ".join(args.pairs).split())), " ".join(args.seeds).split()
    if not pairs or not seeds:
        fail("no pairs in --pairs" if not pairs else "no seeds in --seeds")
    if unknown := [name for name in pairs if name not in PEERS]:
        fail(f"no pair {unknown[0]!r}; the pairs: {', '.join(PEERS)}")
    if bad := [seed for seed in seeds if not seed.isdigit()]:
        fail(f"seed {bad[0]!r} is not a non-negative integer")
    if len(set(seeds)) < len(seeds):
        fail("a seed is given twice in --seeds")
    if not args.timeout > 0:
        fail(f"--timeout must be > 0, not {args.timeout:g}")
    clones = {}
    for key in dict.fromkeys(PEERS[name]["repo"] for name in pairs):
        clone = getattr(args, key)
        if clone is None:
            named = [name for name in pairs if PEERS[name]["repo"] == key]
            s = "s" if len(named) == 1 else ""
            fail(f"{' '.join(named)} need{s} --{key} PATH, a clone of {PEER_REPOS[key][1]}")
        if not clone.is_dir():
            fail(f"--{key} {clone}: no such folder")
        clones[key] = clone.resolve()
    args.ours = args.ours.resolve()
    for name in pairs if not args.apply_only else []:
        if not (args.ours / PEERS[name]["ours"]).is_file():
            fail(f"--ours {args.ours}: no {PEERS[name]['ours']} (for {name})")
    out = args.out or ROOT / "runs" / "peers" / time.strftime("%Y-%m-%d_%H-%M-%S")
    if (out / "peers.jsonl").exists():
        fail(f"{out} already holds a peers.jsonl: give another --out")
    return args, pairs, [int(seed) for seed in seeds], clones, out.resolve()


def main():
    args, pairs, seeds, clones, out = parse_args()
    prepared = prepare(pairs, clones, check_imports=not args.apply_only)
    copies = write_copies(prepared, out)
    print(f"edited copies: {out / 'peers'}/ ({len(copies)} scripts, each with its .diff)")
    if args.apply_only:
        return 0

    machine = describe_machine()
    (out / "logs").mkdir(exist_ok=True)
    (out / "work").mkdir(exist_ok=True)
    print(f"machine: {machine_text(machine)}, torch {machine['torch']}")
    switch = [name for name in pairs if BF16_FIELD.search((args.ours / PEERS[name]["ours"]).read_text())]
    print(bf16_line(machine, switch))
    plan = plan_runs(pairs, seeds, switch if machine["fast_bf16"] else [])
    records, interrupted = [], False
    try:
        for number, (seed, name, side, variants) in enumerate(plan, start=1):
            records += run_side(name, side, variants, seed, f"[{number}/{len(plan)}]", args, copies, out)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: the table holds the runs that ended")
    (out / "peers.md").write_text(report(records, pairs, seeds, args, prepared, clones, machine, switch))
    failed = [run for run in records if run["failed"]]
    print(f"{len(records) - len(failed)} of {len(records)} runs ran; table: {out / 'peers.md'}, runs: "
          f"{out / 'peers.jsonl'}, logs: {out / 'logs'}/")  # fmt: skip
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
