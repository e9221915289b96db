"""benchmarks/rpc_agent_observer.py: small RPC worlds beside the in-process batch, their figures and table; bad
arguments; an interrupted run; no process of a run (each carries its run's marker in its environment) left after it."""

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import REPO_ROOT

TOOL = REPO_ROOT / "benchmarks" / "rpc_agent_observer.py"
sys.path.insert(0, str(TOOL.parent))  # the tool imports common from its folder
_spec = importlib.util.spec_from_file_location("rpc_agent_observer_tool", TOOL)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)  # definitions only: the tool runs under __main__
SMALL = ("--episodes", "2", "--episode-steps", "5")
MARKER = "RPC_AGENT_OBSERVER_TEST_RUN"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def processes_carrying(marker):
    """The pids of this machine's processes (but this one) whose environment holds MARKER=marker."""
    found, variable = [], f"{MARKER}={marker}".encode()
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):  # gone, or not ours to read
            if int(entry.name) != os.getpid() and variable in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def start_tool(out, *flags):
    """The tool in its own session (Ctrl-C in a terminal goes to the whole group, as os.killpg) and its marker."""
    marker = uuid.uuid4().hex
    command = [sys.executable, str(TOOL), "--master-port", str(free_port()), "--out", str(out), *map(str, flags)]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, MARKER: marker}, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    return process, marker


def wait_for(condition, what, timeout_s=600):
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert condition(), what


def test_summary_takes_throughput_forward_by_forward():
    """Throughput is each forward's states over its own latency, then percentiles; not a ratio of medians."""
    figures = tool.summary(agent_latencies=[0.1, 0.2, 0.4, 0.5, 1.0], forward_s=[0.1] * 5, batch_sizes=[1, 2, 4, 1, 2],
                           observer_latencies=[0.25, 0.5, 1.0, 2.0], env_steps=10, wall_s=2.0)  # fmt: skip
    # per forward 10, 10, 10, 2, 2 states/s (the ratio of medians would be 2 / 0.4 = 5)
    assert figures["agent_throughput"]["p50"] == pytest.approx(10.0)
    # 1 / latency: 4, 2, 1, 0.5, median 1.5 (1 / the latency's median would be 1 / 0.75)
    assert figures["observer_throughput"]["p50"] == pytest.approx(1.5)
    assert (figures["forwards"], figures["states"], figures["states_per_forward"], figures["env_steps_per_s"]) == (
        5, 10, 2.0, 5.0)  # fmt: skip


def test_rpc_worlds_and_in_process_batch_report_batches_and_percentiles(tmp_path):
    process, marker = start_tool(tmp_path, "--world-size", "3,4", "--batch", "on,off", *SMALL)
    try:
        stdout, stderr = process.communicate(timeout=600)
    finally:
        process.kill()
    assert process.returncode == 0, stderr[-3000:]
    wait_for(lambda: not processes_carrying(marker), "a process of the run is left", timeout_s=120)

    assert (tmp_path / "rpc_agent_observer.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads((tmp_path / "rpc_agent_observer.json").read_text())
    assert report["swept"] == ["world_size", "batch"] and report["machine"]["torch_threads"] == 1
    assert [(row["config"]["world_size"], row["config"]["batch"]) for row in report["rows"]] == [
        (3, True), (3, False), (4, True), (4, False)]  # fmt: skip
    for row in report["rows"]:
        config, observers = row["config"], row["config"]["world_size"] - 2
        for mode in ("rpc", "in_process"):
            figures, what = row[mode], (config["world_size"], config["batch"], mode)
            for metric in (*tool.METRICS, "forward_s"):
                values = [figures[metric][p] for p in ("p50", "p75", "p90", "p95")]
                assert values == sorted(values) and values[0] > 0, (what, metric, values)
            # the agent's time is its forward, and more only over RPC with batch on (the wait for the batch)
            waits = mode == "rpc" and config["batch"]
            assert all(figures["agent_latency_s"][p] >= figures["forward_s"][p] for p in ("p50", "p95")), what
            assert waits or figures["agent_latency_s"] == figures["forward_s"], what
            assert figures["states"] == figures["env_steps"] == 2 * 5 * observers and figures["env_steps_per_s"] > 0
        # the batch the policy saw: every observer's state in one forward, but over RPC with batch off
        batch = observers if config["batch"] else 1
        assert (row["rpc"]["states_per_forward"], row["rpc"]["forwards"]) == (batch, 2 * 5 * observers // batch)
        assert (row["in_process"]["states_per_forward"], row["in_process"]["forwards"]) == (observers, 2 * 5)
    on, off = report["rows"][2:]
    assert on["rpc"]["states_per_forward"] == 2 and on["in_process"] == off["in_process"]  # once per world size

    table = subprocess.run([sys.executable, str(TOOL), "--markdown", tmp_path / "rpc_agent_observer.json"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert table.returncode == 0 and table.stdout.strip() in stdout, "a run prints the table --markdown prints"
    rows = [line.split("|")[1:6] for line in table.stdout.splitlines()[2:]]
    assert [[cell.strip() for cell in row] for row in rows] == [
        ["3", "1", "RPC agent/observer", "on", "1.0"], ["3", "1", "RPC agent/observer", "off", "1.0"],
        ["3", "1", "in-process batch", "–", "1.0"], ["4", "2", "RPC agent/observer", "on", "2.0"],
        ["4", "2", "RPC agent/observer", "off", "1.0"], ["4", "2", "in-process batch", "–", "2.0"]]  # fmt: skip


BAD = {
    "world of 2": (["--world-size", "2"], "--world-size: '2' is not a whole number of at least 3"),
    "empty list item": (["--world-size", "3,,4"], "--world-size '3,,4': an empty item or one listed twice"),
    "not a number": (["--world-size", "3,x"], "--world-size: 'x' is not a whole number of at least 3"),
    "a value twice": (["--batch", "on,on"], "--batch 'on,on': an empty item or one listed twice"),
    "batch": (["--batch", "maybe"], "--batch: 'maybe' is not on or off"),
    "transport": (["--transport", "auto,ib"], "--transport: 'ib' is not auto or tcp"),
    "no episodes": (["--episodes", "0"], "--episodes, --episode-steps, --rpc-timeout and --timeout must be positive"),
    "port in use": (["--master-port", "PORT"], "--master-port PORT: not a port free on 127.0.0.1"),
    "an option of old": (["--nlayers", "2"], "unrecognized arguments: --nlayers 2"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_arguments_exit_2_in_one_line(case, tmp_path, monkeypatch, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        flags, message = [flag.replace("PORT", port) for flag in BAD[case][0]], BAD[case][1].replace("PORT", port)
        default_port = [] if "--master-port" in flags else ["--master-port", str(free_port())]
        monkeypatch.setattr(sys, "argv", [str(TOOL), *flags, *default_port, "--out", str(tmp_path / "out")])
        with pytest.raises(SystemExit) as exit_:
            tool.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(f"rpc_agent_observer.py: error: {message}") and err.count("\n") == 1
    assert not (tmp_path / "out").exists(), "nothing is written before the arguments are checked"


def test_an_interrupted_run_keeps_the_worlds_done(tmp_path, monkeypatch, capsys):
    """SIGTERM during the second world: exit 143, one line, the first world in the JSON (in this process, the worlds
    stood in for)."""
    done = []

    def world(config, port, timeout_s):
        if done:
            raise tool.Interrupted(signal.SIGTERM)
        done.append(config)
        return tool.run_in_process(config), None

    monkeypatch.setattr(tool, "run_rpc_world", world)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # pytest keeps its own handlers
    for variable in ("TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):  # set as the tool sets them, then restored
        monkeypatch.setenv(variable, "lo")
    port = ["--master-port", str(free_port())]
    monkeypatch.setattr(sys, "argv", [str(TOOL), "--world-size", "3,4", *SMALL, *port, "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        tool.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 143 and err == "rpc_agent_observer.py: interrupted by SIGTERM, 1 world(s) done\n", err
    (row,) = json.loads((tmp_path / "rpc_agent_observer.json").read_text())["rows"]
    assert row["config"] == json.loads(json.dumps(done[0])) and row["rpc"]["env_steps"] == 2 * 5


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "launcher-killed"])
def test_no_worker_outlives_ctrl_c_or_the_launcher_killed(tmp_path, signum):
    """A world of a million steps over TCP. Ctrl-C (SIGINT to the group) ends the tool with 130 and one line; SIGKILL
    to the launcher alone: its workers see it is gone and exit. Before Ctrl-C the world runs past --rpc-timeout, which
    bounds each step's RPC, not the episode."""
    flags = ("--world-size", "3", "--episodes", "1", "--episode-steps", "1000000", "--rpc-timeout", "3", "--transport",
             "tcp")  # fmt: skip
    process, marker = start_tool(tmp_path, *flags)
    try:  # until the launcher, the resource tracker, the forkserver and a world of three workers are all running
        wait_for(lambda: len(processes_carrying(marker)) >= 6 or process.poll() is not None, "no world started")
        time.sleep(3 + 2 if signum == signal.SIGINT else 0)  # a world that the RPC timeout stops would have failed
        assert process.poll() is None, process.stderr.read()[-3000:]
        (os.killpg if signum == signal.SIGINT else os.kill)(process.pid, signum)  # the group, or the launcher alone
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    if signum == signal.SIGINT:
        assert process.returncode == 130 and stderr == "rpc_agent_observer.py: interrupted by SIGINT, 0 world(s) done\n"
    wait_for(lambda: not processes_carrying(marker), "a process of the run is left", timeout_s=120)
