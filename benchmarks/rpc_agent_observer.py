"""Serving a policy to many envs over torch.distributed.rpc (an agent and its observers) beside one process that steps
every env and runs the policy once per step on the whole batch (what the scripts here do). docs/rpc.md describes the
worlds (rank 0 coordinates, rank 1 is the agent, ranks 2 and up are observers), the figures and the table.

    python benchmarks/rpc_agent_observer.py                                   # a world of 10: 8 observers, batch on
    python benchmarks/rpc_agent_observer.py --world-size 3,4,5,6,7,8,9 --batch on,off --out docs/rpc
    python benchmarks/rpc_agent_observer.py --world-size 3,6,9 --transport auto,tcp --out docs/rpc/tcp
    python benchmarks/rpc_agent_observer.py --markdown docs/rpc/rpc_agent_observer.json   # the table, again

A warm-up episode, then --episodes of --episode-steps steps, on 127.0.0.1, one torch thread per process. --batch on:
the agent answers a step's requests from one forward once every observer's state is in; off: one at a time. Lists run
every combination, one world after another, into DIR/rpc_agent_observer.json and .png (--out DIR).
"""

import argparse
import contextlib
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
from common import Parser, describe_machine, fail, machine_text, table_head, table_row  # benchmarks/ is on the path

TOOL = Path(__file__).name
PERCENTILES = (50, 75, 90, 95)
METRICS = ("agent_latency_s", "agent_throughput", "observer_latency_s", "observer_throughput")
LISTED = ("world_size", "batch", "transport")  # the arguments that take a list
# PyTorch's benchmark's policy and its warm-up: the same in every world and in process
FIXED = {"state_size": (10, 20, 10), "nlayers": 5, "out_features": 10, "warmup_steps": 10, "seed": 1}
AGENT = "agent"
ROLE = None  # in a worker: the agent, or an observer's (index, env, the agent's function it calls)


class Interrupted(Exception):
    """Ctrl-C or SIGTERM (its number the argument) reached the launcher: stop every worker, exit 128 + the signal."""


def make_policy(config):
    torch.manual_seed(config["seed"])  # the same weights in the agent and in process
    width = config["out_features"]
    layers = [torch.nn.Flatten(1), torch.nn.Linear(math.prod(config["state_size"]), width)]
    for _ in range(config["nlayers"]):
        layers += [torch.nn.ReLU(), torch.nn.Linear(width, width)]
    return torch.nn.Sequential(*layers)


@torch.inference_mode()
def act(policy, states):
    """One action per state: a sample from the softmax of the action scores."""
    return torch.multinomial(torch.softmax(policy(states), dim=-1), 1).squeeze(1).tolist()


def dummy_env(config, index):
    """An env that costs next to nothing, whatever the action: each step a random state and a random reward."""
    generator = torch.Generator().manual_seed(config["seed"] + 1 + index)
    while True:
        yield torch.rand(config["state_size"], generator=generator)
        torch.rand((), generator=generator)  # the reward


def percentiles(values):
    points = np.percentile(np.asarray(values, dtype=np.float64), PERCENTILES)
    return {f"p{p}": float(v) for p, v in zip(PERCENTILES, points, strict=True)}


def summary(agent_latencies, forward_s, batch_sizes, observer_latencies, env_steps, wall_s):
    """A world's figures; the throughputs are taken forward by forward (request by request), then their percentiles."""
    agent, batch, observer = (np.asarray(values) for values in (agent_latencies, batch_sizes, observer_latencies))
    return dict(agent_latency_s=percentiles(agent), agent_throughput=percentiles(batch / agent),
                observer_latency_s=percentiles(observer), observer_throughput=percentiles(1 / observer),
                forward_s=percentiles(forward_s), forwards=len(batch), states=int(batch.sum()),
                states_per_forward=float(batch.mean()), env_steps=int(env_steps), wall_s=wall_s,
                env_steps_per_s=env_steps / wall_s)  # fmt: skip


def run_in_process(config):
    """Every env stepped here, one forward per step on the whole batch."""
    torch.set_num_threads(1)  # as each RPC worker
    policy, observers = make_policy(config), config["world_size"] - 2
    envs = [dummy_env(config, index) for index in range(observers)]
    forward_s, observer_latencies, wall_s = [], [], 0.0
    for episode in range(config["episodes"] + 1):  # episode 0: the warm-up
        episode_start = time.perf_counter()
        for _ in range(config["episode_steps"] if episode else config["warmup_steps"]):
            states = [next(env) for env in envs]  # the envs' step
            start = time.perf_counter()
            states = torch.stack(states)
            forward_start = time.perf_counter()
            act(policy, states)  # the actions, handed to the envs
            end = time.perf_counter()
            if episode:
                forward_s.append(end - forward_start)  # the forward is all the agent does here
                observer_latencies.append(end - start)
        wall_s += (time.perf_counter() - episode_start) if episode else 0.0
    env_steps = config["episodes"] * config["episode_steps"] * observers
    return summary(forward_s, forward_s, [observers] * len(forward_s), observer_latencies, env_steps, wall_s)


# --- The RPC world: what each role does in its own process ------------------------------------------------------------


class Agent:
    def __init__(self, config):
        self.policy, self.observers = make_policy(config), config["world_size"] - 2
        self.states = torch.zeros(self.observers, *config["state_size"])
        self.lock, self.waiting, self.batch_start = threading.Lock(), [], None  # waiting: (observer, future) held
        self.metrics = [], [], []  # per forward: the agent's latency, the forward alone, the states

    def forward(self, states, start=None):
        forward_start = time.perf_counter()
        actions = act(self.policy, states)
        end = time.perf_counter()
        latency = end - (start or forward_start)
        for values, value in zip(self.metrics, (latency, end - forward_start, len(actions)), strict=True):
            values.append(value)
        return actions

    def submit(self, index, state):
        """Batch on: hold the request until every observer's state has arrived, then serve them all in one forward."""
        future = torch.futures.Future()
        with self.lock:
            self.batch_start = self.batch_start if self.waiting else time.perf_counter()
            self.states[index].copy_(state)
            self.waiting.append((index, future))
            if len(self.waiting) < self.observers:
                return future
            actions = self.forward(self.states, self.batch_start)
            served, self.waiting = self.waiting, []
        for observer, waiting in served:
            waiting.set_result(actions[observer])
        return future


@rpc.functions.async_execution
def select_action_batched(index, state):
    return ROLE.submit(index, state)


def select_action_one(index, state):
    with ROLE.lock:  # batch off: one request at a time, one forward each
        return ROLE.forward(state.unsqueeze(0))[0]


def agent_metrics():
    with ROLE.lock:
        metrics, ROLE.metrics = ROLE.metrics, ([], [], [])
    return metrics


def observer_episode(steps):
    index, env, select_action = ROLE
    latencies = []
    for state in itertools.islice(env, steps):
        start = time.perf_counter()
        rpc.rpc_sync(AGENT, select_action, args=(index, state))  # the action, handed to the env
        latencies.append(time.perf_counter() - start)
    return latencies


def coordinate(config, result_path):
    observers = [f"observer{index}" for index in range(config["world_size"] - 2)]
    observer_latencies, wall_s = [], 0.0
    for episode in range(config["episodes"] + 1):  # episode 0: the warm-up
        start = time.perf_counter()
        steps = config["episode_steps"] if episode else config["warmup_steps"]
        # no timeout of an episode's own (0): --rpc-timeout bounds each step's RPC, --timeout the world
        futures = [rpc.rpc_async(name, observer_episode, args=(steps,), timeout=0) for name in observers]
        latencies = [latency for future in futures for latency in future.wait()]
        if episode == 0:
            rpc.rpc_sync(AGENT, agent_metrics)  # the warm-up's forwards, dropped
            continue
        wall_s += time.perf_counter() - start
        observer_latencies += latencies
    env_steps = config["episodes"] * config["episode_steps"] * len(observers)
    figures = summary(*rpc.rpc_sync(AGENT, agent_metrics), observer_latencies, env_steps, wall_s)
    Path(result_path).write_text(json.dumps(figures))


def exit_with(launcher):
    """A worker whose launcher is gone (killed) exits instead of waiting on RPCs that will not come: the launcher holds
    the pipe's other end, which closes as it dies (the forkserver, the workers' parent, may outlive it)."""
    with contextlib.suppress(EOFError, OSError):
        launcher.recv()
    os._exit(1)


def worker(rank, config, port, launcher, result_path, others_done):
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # held while the launcher started the workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # blocked already (see run_rpc_world); the launcher stops us
    threading.Thread(target=exit_with, args=(launcher,), daemon=True).start()
    # rpc's init and shutdown gather their workers' names through a process group the way torch now warns about
    warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
    torch.set_num_threads(1)
    global ROLE
    if rank == 1:
        ROLE = Agent(config)
    elif rank >= 2:
        ROLE = rank - 2, dummy_env(config, rank - 2), select_action_batched if config["batch"] else select_action_one
    # tcp: TensorPipe's TCP transport (libuv) and its basic channel, tensors over that connection, as between machines
    tcp = {"_transports": ["uv"], "_channels": ["basic"]} if config["transport"] == "tcp" else {}
    options = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}",
        rpc_timeout=config["rpc_timeout"],
        num_worker_threads=max(16, config["world_size"] + 4),  # batch off: a blocked thread per waiting observer
        **tcp,
    )
    name = "coordinator" if rank == 0 else AGENT if rank == 1 else f"observer{rank - 2}"
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
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, sig)
        for process in running:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def run_rpc_world(config, port, timeout_s):
    """Starts the world's processes and returns the coordinator's figures; None and a reason if it fails."""
    # forkserver: a server process imports torch once and forks each worker from it, ready to run; spawned workers
    # would each import torch again (seconds each on a loaded 2-core machine, against a second for all the steps)
    context = torch.multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed.rpc", "numpy"])
    with tempfile.TemporaryDirectory(prefix="rpc_agent_observer_") as folder:
        result_path, others_done = Path(folder) / "result.json", context.Event()
        wait_s = 5  # for a finished world's workers to exit, or for the others once one has failed
        launcher, held = context.Pipe(duplex=False)  # held open here while the world runs
        arguments = (config, port, launcher, str(result_path), others_done)
        processes = [context.Process(target=worker, args=(rank, *arguments), daemon=True)
                     for rank in range(config["world_size"])]  # fmt: skip
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
                if failed := [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]:
                    return None, "rank {} exited with status {}".format(*failed[0])
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
            held.close()
            launcher.close()


def check_port(port):
    """A user's error unless port is free on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's listener: TIME_WAIT is no owner
        try:
            probe.bind(("127.0.0.1", port))
        except (OSError, OverflowError):
            fail(f"--master-port {port}: not a port free on 127.0.0.1 (pick another)")


# --- The command line, the table and the plot -------------------------------------------------------------------------


def listed(flag, choices=None):
    """An argparse type: a comma-separated list, none empty or twice, of choices (text: value) or world sizes."""

    def parse(text):
        items = [item.strip().lower() for item in text.split(",")]
        if not all(items) or len(set(items)) < len(items):
            fail(f"{flag} {text!r}: an empty item or one listed twice")
        for item in items:
            if choices is None and not (item.isdigit() and int(item) >= 3):
                fail(f"{flag}: {item!r} is not a whole number of at least 3 (a coordinator, the agent, an observer)")
            if choices is not None and item not in choices:
                fail(f"{flag}: {item!r} is not {' or '.join(choices)}")
        return [int(item) if choices is None else choices[item] for item in items]

    return parse


def label(name, value):
    return ("off", "on")[value] if name == "batch" else str(value)


def markdown(report):
    """The docs' table: per world size, each RPC world, then the in-process run; p50 and p95 of each metric (the JSON
    has p75 and p90 too); a transport column where several were listed."""
    shown = ["transport"] if "transport" in report["swept"] else []
    header = ["world size", "observers", "mode", "batch", *shown, "states per forward", "forward ms p50",
              "agent latency ms p50 / p95", "agent throughput p50 / p95", "observer latency ms p50 / p95",
              "observer throughput p50 / p95", "env steps/s"]  # fmt: skip
    lines = table_head(*header)
    worlds = {}
    for row in report["rows"]:
        worlds.setdefault(row["config"]["world_size"], []).append(row)
    for size, rows in worlds.items():
        modes = [("RPC agent/observer", [label(name, row["config"][name]) for name in ["batch", *shown]], row["rpc"])
                 for row in rows] + [("in-process batch", ["–"] * (1 + len(shown)), rows[0]["in_process"])]  # fmt: skip
        for mode, settings, figures in modes:
            cells = [str(size), str(size - 2), mode, *settings, f"{figures['states_per_forward']:.1f}",
                     f"{figures['forward_s']['p50'] * 1e3:.3f}"]  # fmt: skip
            for metric in METRICS:  # latencies in ms to 3 decimals, throughputs to units
                scale, digits = (1e3, 3) if metric.endswith("_s") else (1, 0)
                cells.append(" / ".join(f"{figures[metric][p] * scale:.{digits}f}" for p in ("p50", "p95")))
            lines.append(table_row(*cells, f"{figures['env_steps_per_s']:.0f}"))
    return "\n".join(lines)


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    lines = {}  # legend -> {world size: figures}: RPC per listed --batch and --transport, in process once
    for row in report["rows"]:
        config = row["config"]
        others = [name for name in report["swept"] if name != "world_size"]
        rpc_line = "RPC" + "".join(f", {name} {label(name, config[name])}" for name in others)
        lines.setdefault(rpc_line, {})[config["world_size"]] = row["rpc"]
        lines.setdefault("in process", {})[config["world_size"]] = row["in_process"]
    lines["in process"] = lines.pop("in process")  # drawn after the RPC lines
    titles = {"agent_latency_s": "agent latency (s)", "agent_throughput": "agent throughput (states/s)",
              "observer_latency_s": "observer latency (s)", "observer_throughput": "observer throughput (requests/s)",
              "env_steps_per_s": "env steps/s (all observers)",
              "states_per_forward": "states per forward (mean)"}  # fmt: skip
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    colors = plt.get_cmap("tab10").colors
    for ax, (metric, title) in zip(axes.flat, titles.items(), strict=True):
        for index, (legend, points) in enumerate(lines.items()):
            style = dict(fmt="--s" if legend == "in process" else "-o", color=colors[index % 10], label=legend)
            if metric in METRICS:
                p50, p95 = ([figures[metric][p] for figures in points.values()] for p in ("p50", "p95"))
                ax.fill_between(list(points), p50, p95, color=style["color"], alpha=0.12)
            else:
                p50 = [figures[metric] for figures in points.values()]
            ax.plot(list(points), p50, style.pop("fmt"), **style)
        ax.set(yscale="linear" if metric == "states_per_forward" else "log", xlabel="world size")
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


def main():
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--world-size", type=listed("--world-size"), default=[10], help="processes: coordinator, agent, observers")
    add("--batch", type=listed("--batch", {"on": True, "off": False}), default=[True], help="on or off (a list)")
    add("--transport", type=listed("--transport", {"auto": "auto", "tcp": "tcp"}), default=["auto"],
        help="auto (shared memory on one machine) or tcp (loopback, as between machines)")  # fmt: skip
    add("--episodes", type=int, default=10, help="measured episodes (default 10)")
    add("--episode-steps", type=int, default=100, help="steps per episode (default 100)")
    add("--master-port", type=int, default=29501, help="the RPC store's port on 127.0.0.1")
    add("--rpc-timeout", type=float, default=60.0, help="seconds an RPC may take before it fails")
    add("--timeout", type=float, default=600.0, help="seconds one world may run before it is stopped")
    add("--out", type=Path, default=Path("runs/rpc_agent_observer"), help="folder for JSON and PNG")
    add("--markdown", type=Path, metavar="JSON", help="only print the table of a JSON this tool wrote")
    args = parser.parse_args()

    if args.markdown:
        try:
            table = markdown(json.loads(args.markdown.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as error:
            fail(f"{args.markdown}: not a JSON this tool wrote ({type(error).__name__}: {error})")
        print(table)
        return
    if min(args.episodes, args.episode_steps, args.rpc_timeout, args.timeout) <= 0:
        fail("--episodes, --episode-steps, --rpc-timeout and --timeout must be positive")
    check_port(args.master_port)
    json_path, png_path = args.out / "rpc_agent_observer.json", args.out / "rpc_agent_observer.png"
    try:  # the outputs' folder is checked writable before the first world
        args.out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=args.out).close()
    except OSError as error:
        fail(f"--out {args.out}: cannot write there ({error.strerror})")

    values = [getattr(args, name) for name in LISTED]
    fixed = dict(FIXED, episodes=args.episodes, episode_steps=args.episode_steps, rpc_timeout=args.rpc_timeout,
                 world_timeout=args.timeout)  # fmt: skip
    configs = [dict(zip(LISTED, combination, strict=True), **fixed) for combination in itertools.product(*values)]
    machine = dict(describe_machine(), torch_threads=1)  # every worker and the in-process mode
    swept = [name for name, given in zip(LISTED, values, strict=True) if len(given) > 1]
    command = " ".join(["python", f"benchmarks/{TOOL}", *sys.argv[1:]])
    report = dict(tool=TOOL, command=command, machine=machine, machine_text=machine_text(machine),
                  load_before=list(os.getloadavg()), swept=swept, rows=[])  # fmt: skip
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")  # the workers' TensorPipe listens on loopback only
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

    def interrupt(signum, frame):
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    start, in_process = time.monotonic(), {}
    try:
        for config in configs:
            check_port(args.master_port)
            world_start, size = time.monotonic(), config["world_size"]
            figures, reason = run_rpc_world(config, args.master_port, args.timeout)
            if figures is None:
                print(f"{TOOL}: the world of {size} failed: {reason}", file=sys.stderr)
                sys.exit(1)
            if size not in in_process:  # once per world size: it has no batch to turn off, no transport
                in_process[size] = run_in_process(config)
            report["rows"].append(dict(config=config, rpc=figures, in_process=in_process[size],
                                       load=os.getloadavg()[0]))  # fmt: skip
            report["load_after"] = list(os.getloadavg())
            json_path.write_text(json.dumps(report, indent=1) + "\n")  # a stopped run keeps the worlds done
            print(f"world {size}, batch {label('batch', config['batch'])}, transport {config['transport']}: RPC "
                  f"{figures['env_steps_per_s']:.0f} env steps/s ({figures['states_per_forward']:.1f} states per "
                  f"forward), in process {in_process[size]['env_steps_per_s']:.0f}; "
                  f"{time.monotonic() - world_start:.1f} s", flush=True)  # fmt: skip
    except Interrupted as stopped:
        signum = stopped.args[0]
        print(f"{TOOL}: interrupted by {signal.Signals(signum).name}, {len(report['rows'])} world(s) done",
              file=sys.stderr)  # fmt: skip
        sys.exit(128 + signum)
    plot(report, png_path)
    print(f"\n{len(configs)} world(s) in {time.monotonic() - start:.0f} s; load {report['load_after'][0]:.2f}")
    print(markdown(report))
    print(f"\nfigures: {json_path}\nplot: {png_path}")


if __name__ == "__main__":
    main()
