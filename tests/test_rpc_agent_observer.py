"""benchmarks/rpc_agent_observer.py: small RPC worlds (an agent, one or two observers) beside the in-process batch,
their JSON's figures, the table and the plot; bad arguments refused in one line; and no worker left running after a
run, Ctrl-C, or the launcher killed.

Every run gets a marker in its environment, which each process it starts inherits (the forkserver, its workers,
multiprocessing's resource tracker): after the run no process on the machine may still carry it.
"""

import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import REPO_ROOT
from test_speedup_table import assert_png

TOOL = REPO_ROOT / "benchmarks" / "rpc_agent_observer.py"
SMALL = ("--episodes", "2", "--episode-steps", "5", "--warmup-steps", "2")
METRICS = ("agent_latency_s", "agent_throughput", "observer_latency_s", "observer_throughput")
MARKER = "RPC_AGENT_OBSERVER_TEST_RUN"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def processes_carrying(marker):
    """The pids of this machine's processes whose environment holds MARKER=marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if f"{MARKER}={marker}".encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def assert_none_left(marker, within_s=120):
    """Every process of the run has ended (the forkserver and resource tracker end when they see the launcher go)."""
    deadline = time.monotonic() + within_s
    while processes_carrying(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_carrying(marker)
    assert not left, f"still running after the launcher ended: {left}"


def start_tool(out, *flags):
    """The tool in its own session (a terminal's Ctrl-C goes to the whole group: os.killpg does the same) and its
    marker."""
    marker = uuid.uuid4().hex
    command = [sys.executable, str(TOOL), "--master-port", str(free_port()), "--out", str(out), *map(str, flags)]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, MARKER: marker}, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    return process, marker


def test_summary_takes_throughput_forward_by_forward():
    """Throughput is each forward's states over its own latency, then percentiles; not a ratio of medians."""
    summary = runpy.run_path(str(TOOL))["summary"]
    figures = summary(agent_latencies=[0.1, 0.2, 0.4, 0.5, 1.0], forward_s=[0.1] * 5, batch_sizes=[1, 2, 4, 1, 2],
                      observer_latencies=[0.25, 0.5, 1.0, 2.0], env_steps=10, wall_s=2.0)  # fmt: skip
    # per forward 10, 10, 10, 2, 2 states/s (the ratio of medians would be 2 / 0.4 = 5)
    assert figures["agent_throughput"]["p50"] == pytest.approx(10.0)
    # 1 / latency: 4, 2, 1, 0.5, median 1.5 (1 / the latency's median would be 1 / 0.75)
    assert figures["observer_throughput"]["p50"] == pytest.approx(1.5)
    assert (figures["forwards"], figures["states"], figures["states_per_forward"]) == (5, 10, 2.0)
    assert figures["env_steps_per_s"] == 5.0


def test_rpc_worlds_and_in_process_batch_report_batches_and_percentiles(tmp_path):
    process, marker = start_tool(tmp_path, "--world-size", "3,4", "--batch", "on,off", *SMALL)
    try:
        stdout, stderr = process.communicate(timeout=600)
    finally:
        process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert_none_left(marker)

    report = json.loads((tmp_path / "rpc_agent_observer.json").read_text())
    assert report["swept"] == ["world_size", "batch"]
    assert [(row["config"]["world_size"], row["config"]["batch"]) for row in report["rows"]] == [
        (3, True), (3, False), (4, True), (4, False)
    ]  # fmt: skip
    steps = 2 * 5
    for row in report["rows"]:
        config, observers = row["config"], row["config"]["world_size"] - 2
        assert (config["state_size"], config["nlayers"], config["out_features"]) == ([10, 20, 10], 5, 10)
        assert config["transport"] == "auto"
        for mode in ("rpc", "in_process"):
            figures = row[mode]
            what = f"world {config['world_size']}, batch {config['batch']}, {mode}"
            for metric in (*METRICS, "forward_s"):
                values = [figures[metric][p] for p in ("p50", "p75", "p90", "p95")]
                assert values == sorted(values) and values[0] > 0, (what, metric, values)
            # the agent's time holds its forward, and only that but for RPC with batch on (the wait for the batch)
            for p in ("p50", "p95"):
                assert figures["agent_latency_s"][p] >= figures["forward_s"][p], what
                if mode == "in_process" or not config["batch"]:
                    assert figures["agent_latency_s"][p] == figures["forward_s"][p], what
            # every forward here has the same batch (asserted below), so a throughput taken forward by forward
            # has its median at or above the batch over the latency's 75th percentile (test_summary: exact values)
            batch = figures["states_per_forward"]
            assert figures["agent_throughput"]["p50"] >= batch / figures["agent_latency_s"]["p75"] * (1 - 1e-12), what
            assert figures["observer_throughput"]["p50"] >= 1 / figures["observer_latency_s"]["p75"] * (1 - 1e-12), what
            assert figures["states"] == figures["env_steps"] == steps * observers, what
            assert figures["env_steps_per_s"] > 0 and figures["wall_s"] > 0, what
        # the batch the policy saw: every observer's state in one forward, but for RPC with batch off
        rpc_batch = observers if config["batch"] else 1
        assert row["rpc"]["states_per_forward"] == rpc_batch, row["rpc"]
        assert row["rpc"]["forwards"] == steps * observers // rpc_batch, row["rpc"]
        assert row["in_process"]["states_per_forward"] == observers, row["in_process"]
        assert row["in_process"]["forwards"] == steps, row["in_process"]
    assert report["rows"][2]["rpc"]["states_per_forward"] == 2  # batching happened over RPC
    for on, off in (report["rows"][0:2], report["rows"][2:4]):  # one in-process run for --batch on and off
        assert on["in_process"] == off["in_process"]
    assert len(report["load_before"]) == 3 and report["machine"]["torch_threads"] == 1

    assert_png(tmp_path / "rpc_agent_observer.png")
    table = subprocess.run([sys.executable, str(TOOL), "--markdown", tmp_path / "rpc_agent_observer.json"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert table.returncode == 0, table.stderr
    rows = [line.split("|")[1:-1] for line in table.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0][0].strip() == "world size" and len(rows) == 1 + 6, table.stdout
    assert [[cell.strip() for cell in row[:5]] for row in rows[1:]] == [
        ["3", "1", "RPC agent/observer", "on", "1.0"],
        ["3", "1", "RPC agent/observer", "off", "1.0"],
        ["3", "1", "in-process batch", "–", "1.0"],
        ["4", "2", "RPC agent/observer", "on", "2.0"],
        ["4", "2", "RPC agent/observer", "off", "1.0"],
        ["4", "2", "in-process batch", "–", "2.0"],
    ]
    assert table.stdout.strip() in stdout, "a run prints the same table as --markdown"


BAD = {
    "world of 2": (["--world-size", "2"], "--world-size: 2 is below 3 (the world needs a coordinator"),
    "empty list item": (["--world-size", "3,,4"], "--world-size '3,,4': an empty item"),
    "not a number": (["--world-size", "3,x"], "--world-size: 'x' is not a whole number"),
    "a value twice": (["--batch", "on,on"], "--batch 'on,on': a value is listed twice"),
    "batch": (["--batch", "maybe"], "--batch: 'maybe' is not on or off"),
    "transport": (["--transport", "auto,ib"], "--transport: 'ib' is not auto or tcp"),
    "state size": (["--state-size", "10-0-10"], "--state-size: '10-0-10' is not a shape"),
    "negative layers": (["--world-size", "3,4", "--nlayers", "2,-1"], "--nlayers: -1 is below 0\n"),
    "port in use": (["--master-port", "PORT"], "--master-port PORT: the port is in use"),
}


@pytest.fixture
def busy_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.mark.parametrize("case", BAD)
def test_bad_arguments_exit_2_in_one_line(case, busy_port, tmp_path, monkeypatch, capsys):
    """In this process (a subprocess costs seconds of imports): the tool's __main__ under its own name."""
    flags, message = BAD[case]
    flags = [flag.replace("PORT", str(busy_port)) for flag in flags]
    message = message.replace("PORT", str(busy_port))
    port = [] if "--master-port" in flags else ["--master-port", str(free_port())]
    monkeypatch.syspath_prepend(str(TOOL.parent))
    monkeypatch.setattr(sys, "argv", [str(TOOL), *flags, *port, "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(TOOL), run_name="__main__")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rpc_agent_observer.py: error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists(), "nothing is written before the arguments are checked"


def wait_for_line(process, text, timeout_s=600):
    """Reads the tool's stdout until a line holds `text`: a world is done, the next is under way."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if text in line:
            return
        assert line or process.poll() is None, f"the tool ended: {process.stderr.read()[-3000:]}"
    pytest.fail(f"no line with {text!r} within {timeout_s} s")


def wait_for_workers(process, marker, timeout_s=600):
    """Until the launcher, the resource tracker, the forkserver and a world of three workers are all running."""
    deadline = time.monotonic() + timeout_s
    while len(processes_carrying(marker)) < 6 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert len(processes_carrying(marker)) >= 6, process.poll()


def test_ctrl_c_stops_every_worker(tmp_path):
    """A short world, then one of a million steps: Ctrl-C (SIGINT to the whole group) during it ends the tool with
    130 and one line, the done world kept in the JSON, no worker left. Before that, the long world runs past
    --rpc-timeout, which bounds each step's RPC and not the episode, nor the agent's and observers' wait in shutdown
    for the coordinator's last episode."""
    flags = ("--world-size", "3", "--episode-steps", "5,1000000", "--episodes", "1", "--rpc-timeout", "3",
             "--transport", "tcp")  # fmt: skip
    process, marker = start_tool(tmp_path, *flags)
    try:
        wait_for_line(process, "world 3, batch on, episode_steps 5:")
        wait_for_workers(process, marker)  # the second world's
        time.sleep(3 + 2)  # and then past --rpc-timeout: a world that the timeout stops would have failed by now
        assert process.poll() is None
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr[-3000:]
    assert stderr == "rpc_agent_observer.py: interrupted by SIGINT, 1 world(s) done\n", stderr[-3000:]
    assert_none_left(marker)
    (done,) = json.loads((tmp_path / "rpc_agent_observer.json").read_text())["rows"]
    assert done["config"]["transport"] == "tcp" and done["rpc"]["env_steps"] == 5, done


def test_workers_end_when_the_launcher_is_killed(tmp_path):
    """SIGKILL to the launcher, which then stays a zombie (not reaped until its pipes close): the workers see it is
    gone and exit, and then the forkserver and resource tracker."""
    process, marker = start_tool(tmp_path, "--world-size", "3", "--episode-steps", "1000000", "--episodes", "1")
    try:
        wait_for_workers(process, marker)
        os.kill(process.pid, signal.SIGKILL)  # no cleanup of its own: the workers notice it is gone
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert_none_left(marker)
