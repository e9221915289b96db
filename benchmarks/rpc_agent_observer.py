"""Serving a policy to many envs over torch.distributed.rpc (an agent and its observers) beside one process that steps
every env and runs the policy once per step on the whole batch (what the scripts here do).

    python benchmarks/rpc_agent_observer.py                                   # a world of 10: 8 observers, batch on
    python benchmarks/rpc_agent_observer.py --world-size 3,4,5,6,7,8,9 --batch on,off --out docs/rpc
    python benchmarks/rpc_agent_observer.py --markdown docs/rpc/rpc_agent_observer.json   # the table, again

The RPC world, on this machine only (127.0.0.1): rank 0 is the coordinator, rank 1 the agent, ranks 2 and up the
observers, so --world-size is the observers plus 2 and at least 3. The agent holds the policy: an MLP from the
flattened state (--state-size 10-20-10 is a state of shape 10x20x10) through --nlayers hidden layers of
--out-features units to --out-features action scores, a softmax and a sampled action. Each observer holds a dummy
env (a random state of that shape and a random reward per step) and, every step, sends its state to the agent with
rpc_sync and waits for the action. The coordinator runs --episodes episodes of --episode-steps steps: it starts one
episode on every observer and waits for all of them. With --batch on, the agent holds each request until every
observer's state of that step has arrived, then runs them through the policy in one forward (the batch is the number
of observers); with --batch off, it serves one request at a time, one forward each. TensorPipe carries the RPCs: with
--transport auto as it chooses (between processes of one machine, shared memory), with --transport tcp over TCP on
loopback, as it would between machines (less the network's own latency).

The in-process mode runs the same policy (same weights) over the same dummy envs (same states) and steps in this
process: each step stacks every env's state, runs one forward and hands each env its action, as a vector env does.

Metrics, at p50, p75, p90 and p95 over every forward or request of the measured episodes (a warm-up episode of
--warmup-steps steps goes first and is not counted):
- agent latency: RPC, batch on: from the first state of a batch reaching the agent to that batch's actions; batch off:
  one request's forward and sampling (the agent serves one at a time); in process: the forward and sampling;
- agent throughput: states per forward / agent latency, per forward;
- observer latency: RPC: from an observer sending its state to it holding the action; in process: from stacking the
  states to every env holding its action; observer throughput: 1 / observer latency;
- forward: the policy's forward and sampling alone (batch on: without the wait for the batch to fill);
- states per forward (mean): the batch the policy actually saw; env steps/s: env steps of the measured episodes over
  their wall time (the coordinator's clock: each episode from its start on every observer to its end on the last).
The in-process mode has no batch to turn off and no transport: it runs once per configuration apart from --batch and
--transport, and a sweep of --batch on,off gives both RPC worlds the same in-process figures. Every process runs
torch on one thread. The JSON (--out DIR/rpc_agent_observer.json) holds each world's figures and the machine and its
load; the plot (DIR/rpc_agent_observer.png) draws the p50s against the swept argument.

Any of --world-size, --batch, --transport, --state-size, --nlayers, --out-features, --episodes and --episode-steps
takes a comma-separated list: every combination runs, one world after another, each on --master-port (checked free
before each world). The plot's x axis is --world-size when it is a list, else the first listed argument; the other
combinations are separate lines. docs/rpc.md has the table of this machine and what it means.
"""

import argparse
import itertools
import json
import math
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed.rpc as rpc

TOOL = Path(__file__).name
PERCENTILES = (50, 75, 90, 95)
METRICS = ("agent_latency_s", "agent_throughput", "observer_latency_s", "observer_throughput")
SWEEPABLE = ("world_size", "batch", "transport", "state_size", "nlayers", "out_features", "episodes", "episode_steps")
RPC_ONLY = ("batch", "transport")  # the in-process mode has neither
AGENT = "agent"
MIN_WORLD_SIZE = 3  # coordinator, agent, one observer


def fail(message):
    """A user's mistake: one line on stderr, exit status 2 (speedup_table's helper, imported here only: it imports
    matplotlib, which the RPC workers, importing this file again, need not load)."""
    from speedup_table import fail as fail_  # benchmarks/ is on the path when this file runs

    fail_(message)


class Interrupted(Exception):
    """Ctrl-C or SIGTERM reached the launcher: stop every worker and exit 128 + the signal."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# --- The policy, the dummy env and the percentiles: the same code in both modes --------------------------------------


class Policy(torch.nn.Module):
    def __init__(self, state_size, nlayers, out_features):
        super().__init__()
        layers = [torch.nn.Flatten(1), torch.nn.Linear(math.prod(state_size), out_features)]
        for _ in range(nlayers):
            layers += [torch.nn.ReLU(), torch.nn.Linear(out_features, out_features)]
        self.net = torch.nn.Sequential(*layers)

    @torch.inference_mode()
    def act(self, states):
        """One action per state: a sample from the softmax of the action scores."""
        probs = torch.softmax(self.net(states), dim=-1)
        return torch.multinomial(probs, 1).squeeze(1)


def make_policy(config):
    torch.manual_seed(config["seed"])  # the same weights in the agent and in process
    return Policy(config["state_size"], config["nlayers"], config["out_features"])


class DummyEnv:
    """An env that costs next to nothing: a random state of the given shape and a random reward per step."""

    def __init__(self, state_size, seed):
        self.generator = torch.Generator().manual_seed(seed)
        self.state_size = state_size
        self.state = torch.rand(state_size, generator=self.generator)
        self.reward_sum = 0.0

    def step(self, action):
        self.state = torch.rand(self.state_size, generator=self.generator)
        self.reward_sum += float(torch.rand((), generator=self.generator))


def percentiles(values):
    points = np.percentile(np.asarray(values, dtype=np.float64), PERCENTILES)
    return {f"p{p}": float(v) for p, v in zip(PERCENTILES, points, strict=True)}


def summary(agent_latencies, forward_s, batch_sizes, observer_latencies, env_steps, wall_s):
    agent_latencies, batch_sizes = np.asarray(agent_latencies), np.asarray(batch_sizes)
    observer_latencies = np.asarray(observer_latencies)
    return {
        "agent_latency_s": percentiles(agent_latencies),
        "agent_throughput": percentiles(batch_sizes / agent_latencies),
        "observer_latency_s": percentiles(observer_latencies),
        "observer_throughput": percentiles(1 / observer_latencies),
        "forward_s": percentiles(forward_s),
        "forwards": int(len(batch_sizes)),
        "states": int(batch_sizes.sum()),
        "states_per_forward": float(batch_sizes.mean()),
        "env_steps": int(env_steps),
        "wall_s": wall_s,
        "env_steps_per_s": env_steps / wall_s,
    }


# --- In process: every env stepped here, one forward per step on the whole batch --------------------------------------


def run_in_process(config):
    torch.set_num_threads(1)  # as each RPC worker
    policy = make_policy(config)
    observers = config["world_size"] - 2
    envs = [DummyEnv(config["state_size"], config["seed"] + 1 + index) for index in range(observers)]
    agent_latencies, observer_latencies, wall_s = [], [], 0.0
    for episode in range(config["episodes"] + 1):  # episode 0: the warm-up
        steps = config["warmup_steps"] if episode == 0 else config["episode_steps"]
        episode_start = time.perf_counter()
        for _ in range(steps):
            start = time.perf_counter()
            states = torch.stack([env.state for env in envs])
            forward_start = time.perf_counter()
            actions = policy.act(states)
            forward_end = time.perf_counter()
            actions = actions.tolist()
            end = time.perf_counter()
            for env, action in zip(envs, actions, strict=True):
                env.step(action)
            if episode:
                agent_latencies.append(forward_end - forward_start)  # the forward is all the agent does here
                observer_latencies.append(end - start)
        if episode:
            wall_s += time.perf_counter() - episode_start
    steps = config["episodes"] * config["episode_steps"]
    batch_sizes = [observers] * len(agent_latencies)
    return summary(agent_latencies, agent_latencies, batch_sizes, observer_latencies, steps * observers, wall_s)


# --- The RPC world: what each role does in its own process ------------------------------------------------------------

ROLE = None  # this process's Agent or Observer, for the functions the others call on it by RPC


class Agent:
    def __init__(self, config):
        self.policy = make_policy(config)
        self.observers = config["world_size"] - 2
        self.states = torch.zeros(self.observers, *config["state_size"])
        self.lock = threading.Lock()
        self.waiting = []  # (observer index, future) of the requests held for the batch
        self.batch_start = None
        self.latencies, self.forward_s, self.batch_sizes = [], [], []

    def submit(self, index, state):
        """Batch on: hold the request until every observer's state has arrived, then serve them all in one forward."""
        future = torch.futures.Future()
        with self.lock:
            if not self.waiting:
                self.batch_start = time.perf_counter()
            self.states[index].copy_(state)
            self.waiting.append((index, future))
            if len(self.waiting) < self.observers:
                return future
            forward_start = time.perf_counter()
            actions = self.policy.act(self.states).tolist()
            end = time.perf_counter()
            self.latencies.append(end - self.batch_start)
            self.forward_s.append(end - forward_start)
            self.batch_sizes.append(len(self.waiting))
            served, self.waiting = self.waiting, []
        for observer, waiting in served:
            waiting.set_result(actions[observer])
        return future

    def serve_one(self, state):
        """Batch off: one request at a time, one forward each."""
        with self.lock:
            start = time.perf_counter()
            action = self.policy.act(state.unsqueeze(0)).item()
            self.latencies.append(time.perf_counter() - start)
            self.forward_s.append(self.latencies[-1])
            self.batch_sizes.append(1)
        return action

    def take_metrics(self):
        with self.lock:
            metrics = self.latencies, self.forward_s, self.batch_sizes
            self.latencies, self.forward_s, self.batch_sizes = [], [], []
        return metrics


@rpc.functions.async_execution
def select_action_batched(index, state):
    return ROLE.submit(index, state)


def select_action_one(index, state):
    return ROLE.serve_one(state)


def agent_metrics():
    return ROLE.take_metrics()


class Observer:
    def __init__(self, config, index):
        self.index = index
        self.env = DummyEnv(config["state_size"], config["seed"] + 1 + index)
        self.select_action = select_action_batched if config["batch"] else select_action_one

    def episode(self, steps):
        latencies = []
        for _ in range(steps):
            start = time.perf_counter()
            action = rpc.rpc_sync(AGENT, self.select_action, args=(self.index, self.env.state))
            latencies.append(time.perf_counter() - start)
            self.env.step(action)
        return latencies


def observer_episode(steps):
    return ROLE.episode(steps)


def coordinate(config, result_path):
    observers = [f"observer{index}" for index in range(config["world_size"] - 2)]
    observer_latencies, wall_s = [], 0.0
    for episode in range(config["episodes"] + 1):  # episode 0: the warm-up
        steps = config["warmup_steps"] if episode == 0 else config["episode_steps"]
        start = time.perf_counter()
        # an episode may run longer than --rpc-timeout, which bounds each step's RPC: no timeout of its own (0), the
        # launcher's --timeout bounds the world, and an observer's failure fails its future
        futures = [rpc.rpc_async(name, observer_episode, args=(steps,), timeout=0) for name in observers]
        latencies = [future.wait() for future in futures]
        if episode == 0:
            rpc.rpc_sync(AGENT, agent_metrics)  # the warm-up's forwards, dropped
            continue
        wall_s += time.perf_counter() - start
        observer_latencies += [latency for one in latencies for latency in one]
    agent_latencies, forward_s, batch_sizes = rpc.rpc_sync(AGENT, agent_metrics)
    env_steps = config["episodes"] * config["episode_steps"] * len(observers)
    result = summary(agent_latencies, forward_s, batch_sizes, observer_latencies, env_steps, wall_s)
    Path(result_path).write_text(json.dumps(result))


def is_running(pid):
    """Whether a process runs: a killed one that its parent has not reaped yet (a zombie) does not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):  # gone, or no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def watch_launcher(launcher):
    """A worker whose launcher is gone (killed) exits instead of waiting on RPCs that will not come: its forkserver
    parent outlives the launcher as long as a worker holds the forkserver's pipe."""
    while is_running(launcher):
        time.sleep(0.5)
    os._exit(1)


def worker(rank, config, port, launcher, result_path, others_done):
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # held while the launcher started the workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # blocked already (see run_rpc_world); the launcher stops us
    threading.Thread(target=watch_launcher, args=(launcher,), daemon=True).start()
    # rpc's init and shutdown gather their workers' names through a process group the way torch now warns about
    warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
    torch.set_num_threads(1)
    global ROLE
    name = "coordinator" if rank == 0 else AGENT if rank == 1 else f"observer{rank - 2}"
    if rank == 1:
        ROLE = Agent(config)
    elif rank >= 2:
        ROLE = Observer(config, rank - 2)
    # tcp: TensorPipe's TCP transport (libuv) and its basic channel, which sends tensors over that connection, as
    # between machines; auto: its own choice (on one machine, shared memory)
    tcp = {"_transports": ["uv"], "_channels": ["basic"]} if config["transport"] == "tcp" else {}
    options = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}",
        rpc_timeout=config["rpc_timeout"],
        num_worker_threads=max(16, config["world_size"] + 4),  # batch off: a blocked thread per waiting observer
        **tcp,
    )
    rpc.init_rpc(name, rank=rank, world_size=config["world_size"], rpc_backend_options=options)
    try:
        if rank == 0:
            coordinate(config, result_path)
    finally:
        # graceful: waits until every worker gets here, the agent and observers for the whole run (bounded by --timeout)
        rpc.shutdown(graceful=True, timeout=config["world_timeout"])
        if rank == 0:  # rank 0 hosts the store the others' shutdown still reads: it stays until they have exited
            others_done.wait(timeout=config["world_timeout"])


# --- The launcher: one world per combination of the listed values -----------------------------------------------------


def stop(processes, wait_s):
    """Every worker ends: joined within wait_s, then terminated (and killed if that is not enough). The ones still
    running are all frozen (SIGSTOP) before the first is terminated, so that none runs on to report the others'
    deaths; a second Ctrl-C waits until they are gone."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        processes = [process for process in processes if process.pid is not None]  # started (SIGTERM may cut in)
        deadline = time.monotonic() + wait_s
        for process in processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        running = [process for process in processes if process.is_alive()]
        for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGCONT):  # a stopped process dies as it continues
            for process in running:
                try:
                    os.kill(process.pid, sig)
                except ProcessLookupError:
                    pass
        for process in running:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def run_rpc_world(config, port, timeout_s):
    """Spawns the world's processes and returns the coordinator's figures; None and a reason if it fails."""
    # forkserver: a server process imports torch once and forks each worker from it, ready to run; spawned workers
    # would each import torch again (seconds each on a loaded 2-core machine, against a second for all the steps)
    context = torch.multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed.rpc", "numpy"])
    with tempfile.TemporaryDirectory(prefix="rpc_agent_observer_") as folder:
        result_path = Path(folder) / "result.json"
        others_done = context.Event()
        wait_s = 5  # for a finished world's workers to exit, or for the others once one has failed
        processes = [
            context.Process(
                target=worker, args=(rank, config, port, os.getpid(), str(result_path), others_done), daemon=True
            )
            for rank in range(config["world_size"])
        ]
        try:
            # Ctrl-C reaches the terminal's whole process group: the workers start with SIGINT blocked (a child
            # keeps its parent's signal mask), so only the launcher sees it, and stops them. SIGTERM too is held
            # until every worker has started (each unblocks it first thing): a launcher stopped halfway through
            # would leave a worker it has no pid of. Either signal reaches the launcher on unblocking.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                for process in processes:
                    process.start()
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                codes = [process.exitcode for process in processes]
                failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
                if failed:
                    rank, code = failed[0]
                    return None, f"rank {rank} exited with status {code}"
                if all(code == 0 for code in codes[1:]):
                    others_done.set()
                if all(code == 0 for code in codes):
                    break
                time.sleep(0.05)
            else:
                return None, f"did not finish within {timeout_s:.0f} s (--timeout)"
            if not result_path.is_file():
                return None, "the coordinator wrote no figures"
            return json.loads(result_path.read_text()), None
        except Interrupted:
            wait_s = 0  # a world under way: no point waiting for it
            raise
        finally:
            stop(processes, wait_s)


def port_is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's listener: TIME_WAIT is no owner
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def parse_list(flag, text, parse_one):
    items = text.split(",")
    if any(not item.strip() for item in items):
        fail(f"{flag} {text!r}: an empty item in the comma-separated list")
    values = [parse_one(item.strip()) for item in items]
    if len(set(map(str, values))) != len(values):
        fail(f"{flag} {text!r}: a value is listed twice")
    return values


def positive_int(flag, minimum=1):
    def parse(item):
        try:
            value = int(item)
        except ValueError:
            fail(f"{flag}: {item!r} is not a whole number")
        if value < minimum:
            fail(f"{flag}: {value} is below {minimum}" + (f" ({WHY_MIN_WORLD})" if flag == "--world-size" else ""))
        return value

    return parse


WHY_MIN_WORLD = "the world needs a coordinator, the agent and at least one observer"


def on_off(item):
    values = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
    if item.lower() not in values:
        fail(f"--batch: {item!r} is not on or off")
    return values[item.lower()]


def transport(item):
    if item not in ("auto", "tcp"):
        fail(f"--transport: {item!r} is not auto or tcp")
    return item


def state_size(item):
    dims = item.split("-")
    if not all(dim.isdigit() and int(dim) > 0 for dim in dims):
        fail(f"--state-size: {item!r} is not a shape of positive sizes joined by '-', e.g. 10-20-10")
    return tuple(int(dim) for dim in dims)


def worlds(args):
    """The configurations to run, every combination of the listed values, and the names of the listed arguments."""
    lists = {
        "world_size": parse_list("--world-size", args.world_size, positive_int("--world-size", MIN_WORLD_SIZE)),
        "batch": parse_list("--batch", args.batch, on_off),
        "transport": parse_list("--transport", args.transport, transport),
        "state_size": parse_list("--state-size", args.state_size, state_size),
        "nlayers": parse_list("--nlayers", args.nlayers, positive_int("--nlayers", 0)),
        "out_features": parse_list("--out-features", args.out_features, positive_int("--out-features")),
        "episodes": parse_list("--episodes", args.episodes, positive_int("--episodes")),
        "episode_steps": parse_list("--episode-steps", args.episode_steps, positive_int("--episode-steps")),
    }
    swept = [name for name in SWEEPABLE if len(lists[name]) > 1]
    fixed = {
        "warmup_steps": args.warmup_steps,
        "seed": args.seed,
        "rpc_timeout": args.rpc_timeout,
        "world_timeout": args.timeout,
    }
    configs = [dict(zip(SWEEPABLE, values, strict=True), **fixed) for values in itertools.product(*lists.values())]
    return configs, swept


def label(name, value):
    if name == "batch":
        return "on" if value else "off"
    if name == "state_size":
        return "-".join(map(str, value))
    return str(value)


# --- Reading the figures back: the markdown table and the plot --------------------------------------------------------


def in_process_key(config):
    """The in-process mode runs one forward per step whatever --batch says: one run per configuration apart from it."""
    return tuple(label(name, config[name]) for name in SWEEPABLE if name not in RPC_ONLY)


def groups(report):
    """[(rows of the RPC worlds, their in-process figures)], one per configuration apart from --batch, in order."""
    found = {}
    for row in report["rows"]:
        found.setdefault(in_process_key(row["config"]), ([], row["in_process"]))[0].append(row)
    return list(found.values())


def markdown(report):
    """The docs' table: each RPC world, then the in-process run of the same configuration; p50 and p95 of each metric
    (the JSON has p75 and p90 too)."""
    swept = [name for name in report["swept"] if name not in ("world_size", "batch")]
    header = ["world size", "observers", "mode", "batch", *swept, "states per forward", "forward ms p50"]
    header += [
        "agent latency ms p50 / p95",
        "agent throughput p50 / p95",
        "observer latency ms p50 / p95",
        "observer throughput p50 / p95",
        "env steps/s",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for rows, in_process in groups(report):
        modes = [("RPC agent/observer", row["config"], row["rpc"]) for row in rows]
        modes.append(("in-process batch", None, in_process))  # no batch to turn off, no transport
        for mode, config, figures in modes:

            def pair(metric, scale=1.0, digits=0, figures=figures):
                low, high = figures[metric]["p50"] * scale, figures[metric]["p95"] * scale
                return f"{low:.{digits}f} / {high:.{digits}f}"

            def cell(name, config=config):
                return label(name, config[name]) if config or name not in RPC_ONLY else "–"

            world_size = rows[0]["config"]["world_size"]
            cells = [str(world_size), str(world_size - 2), mode, cell("batch")]
            cells += [label(name, rows[0]["config"][name]) if name not in RPC_ONLY else cell(name) for name in swept]
            cells += [f"{figures['states_per_forward']:.1f}", f"{figures['forward_s']['p50'] * 1e3:.3f}"]
            cells += [
                pair("agent_latency_s", 1e3, 3),
                pair("agent_throughput"),
                pair("observer_latency_s", 1e3, 3),
                pair("observer_throughput"),
                f"{figures['env_steps_per_s']:.0f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    swept = report["swept"]
    x_name = "world_size" if "world_size" in swept or not swept else swept[0]
    categorical = x_name in ("batch", "transport", "state_size")
    ticks = list(dict.fromkeys(label(x_name, row["config"][x_name]) for row in report["rows"]))

    def x_of(row):
        return ticks.index(label(x_name, row["config"][x_name])) if categorical else row["config"][x_name]

    # a line per combination of the other listed values: RPC for each --batch, in process once (it has no batch off)
    lines = {}  # (mode, other values) -> [(x, figures)]
    for mode in ("rpc", "in_process"):
        for row in report["rows"]:
            names = [name for name in swept if name != x_name and (mode == "rpc" or name not in RPC_ONLY)]
            key = (mode, tuple(f"{name.replace('_', ' ')} {label(name, row['config'][name])}" for name in names))
            points = lines.setdefault(key, [])
            if x_of(row) not in [x for x, _ in points]:
                points.append((x_of(row), row[mode]))
    panels = [
        ("agent_latency_s", "agent latency (s)"),
        ("agent_throughput", "agent throughput (states/s)"),
        ("observer_latency_s", "observer latency (s)"),
        ("observer_throughput", "observer throughput (requests/s)"),
        ("env_steps_per_s", "env steps/s (all observers)"),
        ("states_per_forward", "states per forward (mean)"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    colors = plt.get_cmap("tab10").colors
    for ax, (metric, title) in zip(axes.flat, panels, strict=True):
        for index, ((mode, values), points) in enumerate(lines.items()):
            xs = [x for x, _ in points]
            legend = ("RPC" if mode == "rpc" else "in process") + "".join(f", {value}" for value in values)
            style = "-o" if mode == "rpc" else "--s"
            if metric in METRICS:
                p50 = [figures[metric]["p50"] for _, figures in points]
                p95 = [figures[metric]["p95"] for _, figures in points]
                ax.plot(xs, p50, style, color=colors[index % 10], label=legend)
                ax.fill_between(xs, p50, p95, color=colors[index % 10], alpha=0.12)
            else:
                ax.plot(xs, [figures[metric] for _, figures in points], style, color=colors[index % 10], label=legend)
        if categorical:
            ax.set_xticks(range(len(ticks)), ticks)
        if metric != "states_per_forward":
            ax.set_yscale("log")
        ax.set_xlabel(x_name.replace("_", " "))
        ax.set_title(title + (", p50 (band to p95)" if metric in METRICS else ""), fontsize=10)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(
        "RPC agent/observer (solid) against in-process batch (dashed), same policy, envs and steps\n"
        f"{report['machine_text']}; load {report['load_before'][0]:.2f} before, {report['load_after'][0]:.2f} after"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- main ---------------------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", default="10", help="processes: coordinator, agent and observers (>= 3)")
    parser.add_argument("--batch", default="on", help="on: the agent serves all observers in one forward; off: one")
    parser.add_argument(
        "--transport",
        default="auto",
        help="auto: TensorPipe's choice (shared memory on one machine); tcp: TCP on loopback, as between machines",
    )
    parser.add_argument("--state-size", default="10-20-10", help="the observer state's shape, sizes joined by '-'")
    parser.add_argument("--nlayers", default="5", help="hidden layers of the policy")
    parser.add_argument("--out-features", default="10", help="units per layer and actions")
    parser.add_argument("--episodes", default="10", help="measured episodes")
    parser.add_argument("--episode-steps", default="100", help="steps per episode")
    parser.add_argument("--warmup-steps", type=int, default=10, help="steps of the warm-up episode, not measured")
    parser.add_argument("--master-port", type=int, default=29501, help="the RPC store's port on 127.0.0.1")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rpc-timeout", type=float, default=60.0, help="seconds an RPC may take before it fails")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one world may run before it is stopped")
    parser.add_argument("--out", type=Path, default=Path("runs/rpc_agent_observer"), help="folder for JSON and PNG")
    parser.add_argument("--markdown", type=Path, metavar="JSON", help="only print the table of a JSON this tool wrote")
    args = parser.parse_args()

    if args.markdown:
        try:
            report = json.loads(args.markdown.read_text())
            table = markdown(report)
        except (OSError, ValueError, KeyError, TypeError) as error:
            fail(f"{args.markdown}: not a JSON this tool wrote ({type(error).__name__}: {error})")
        print(table)
        return
    configs, swept = worlds(args)
    if args.warmup_steps < 0:
        fail(f"--warmup-steps: {args.warmup_steps} is below 0")
    if not 1 <= args.master_port <= 65535:
        fail(f"--master-port: {args.master_port} is not a port (1 to 65535)")
    if args.rpc_timeout <= 0 or args.timeout <= 0:
        fail("--rpc-timeout and --timeout must be positive")
    if not port_is_free(args.master_port):
        fail(f"--master-port {args.master_port}: the port is in use on 127.0.0.1 (pick another)")
    json_path, png_path = args.out / "rpc_agent_observer.json", args.out / "rpc_agent_observer.png"
    try:  # every output is checked writable before the first world
        args.out.mkdir(parents=True, exist_ok=True)
        for path in (json_path, png_path):
            existed = path.exists()
            with open(path, "a"):
                pass
            if not existed:  # no empty file left behind by a run stopped before its first world
                path.unlink()
    except OSError as error:
        fail(f"--out {args.out}: cannot write there ({error.strerror})")

    from speedup_table import describe_machine, machine_text

    machine = describe_machine()
    machine["torch_threads"] = 1  # every worker and the in-process mode
    report = {
        "tool": TOOL,
        "command": " ".join(["python", f"benchmarks/{TOOL}", *sys.argv[1:]]),
        "machine": machine,
        "machine_text": machine_text(machine),
        "load_before": list(os.getloadavg()),
        "swept": swept,
        "rows": [],
    }
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")  # the workers' TensorPipe listens on loopback only
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

    def interrupt(signum, frame):
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    start, in_process = time.monotonic(), {}
    try:
        for config in configs:
            if not port_is_free(args.master_port):
                fail(f"--master-port {args.master_port}: the port is in use on 127.0.0.1 (pick another)")
            world_start = time.monotonic()
            figures, reason = run_rpc_world(config, args.master_port, args.timeout)
            if figures is None:
                print(f"{TOOL}: the world of {config['world_size']} failed: {reason}", file=sys.stderr)
                sys.exit(1)
            key = in_process_key(config)
            if key not in in_process:  # measured once for --batch on and off: it has no batch to turn off
                in_process[key] = run_in_process(config)
            row = {"config": config, "rpc": figures, "in_process": in_process[key], "load": os.getloadavg()[0]}
            report["rows"].append(row)
            report["load_after"] = list(os.getloadavg())
            json_path.write_text(json.dumps(report, indent=1) + "\n")  # a stopped sweep keeps the worlds done
            others = "".join(
                f", {name} {label(name, config[name])}" for name in swept if name not in ("world_size", "batch")
            )
            print(
                f"world {config['world_size']}, batch {label('batch', config['batch'])}{others}: "
                f"RPC {figures['env_steps_per_s']:.0f} env steps/s ({figures['states_per_forward']:.1f} states per "
                f"forward), in process {row['in_process']['env_steps_per_s']:.0f}; "
                f"{time.monotonic() - world_start:.1f} s",
                flush=True,
            )
    except Interrupted as stopped:
        print(f"{TOOL}: interrupted by {stopped}, {len(report['rows'])} world(s) done", file=sys.stderr)
        sys.exit(128 + stopped.signum)
    plot(report, png_path)
    print(f"\n{len(configs)} world(s) in {time.monotonic() - start:.0f} s; load {report['load_after'][0]:.2f}")
    print(markdown(report))
    print(f"\nfigures: {json_path}\nplot: {png_path}")


if __name__ == "__main__":
    main()
