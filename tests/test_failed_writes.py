"""A write that fails while a run goes (a full disk, a mount gone read-only or away) ends the run as a signal does: the
step ends, what can still be written is written, one line on stderr says what could not be, where, why and what is
intact, and the exit status is run_utils.WRITE_FAILED; no traceback, no temporary file. The faults are made without
root: run_utils' `open` is patched to give files that fail, with the system's own errors."""

import errno
import json
import os

import pytest
import run_utils
import torch
from helpers import SCRIPTS_DIR, describe, load_checkpoint, read_results, run_script_in_process

PLAINS = {  # a pair's tiny run that reaches its second checkpoint at 2 x steps: (flags, steps between checkpoints)
    "dqn": (("--learning-starts", "200", "--batch-size", "32", "--train-frequency", "2"), 100),
    "sac_continuous_action": (("--env-id", "Pendulum-v1", "--learning-starts", "100", "--batch-size", "32"), 100),
    "td3_continuous_action": (("--env-id", "Pendulum-v1", "--learning-starts", "100", "--batch-size", "32"), 100),
    "ppo_continuous_action": (("--env-id", "Pendulum-v1", "--num-steps", "32", "--num-minibatches", "1"), 32),
    "pqn": (("--num-envs", "2", "--num-steps", "16", "--num-minibatches", "1", "--update-epochs", "1"), 32),
}
for atari in ("ppo_atari_envpool", "pqn_atari_envpool", "ppo_atari_envpool_distributed"):
    PLAINS[atari] = (("--num-envs", "2", "--num-steps", "16", "--num-minibatches", "1", "--update-epochs", "1"), 32)
# Every pair of leanrl/: one without a tiny run above fails the collection (a KeyError).
PAIRS = sorted(path.name[: -len("_torchcompile.py")] for path in SCRIPTS_DIR.glob("*_torchcompile.py"))
SCRIPTS = [(plain + twin, *PLAINS[plain]) for plain in PAIRS for twin in ("", "_torchcompile")]
ENOSPC, EIO, EROFS = (OSError(code, os.strerror(code)) for code in (errno.ENOSPC, errno.EIO, errno.EROFS))


class FailingFile:
    """A file whose write number `fail_at` (counted from 1) puts half its bytes, then raises `error`, as do the later
    ones: a disk that fills up as the file is written."""

    def __init__(self, file, fail_at, error):
        self.file, self.fail_at, self.error, self.writes = file, fail_at, error, 0

    def write(self, data):
        self.writes += 1
        if self.writes >= self.fail_at:
            self.file.write(data[: len(data) // 2])
            raise self.error
        return self.file.write(data)

    def flush(self):
        if self.writes >= self.fail_at:
            raise self.error
        self.file.flush()

    def close(self):
        self.file.close()
        if self.writes >= self.fail_at:
            raise self.error

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def fail_writes(monkeypatch, ending, nth_file, error=ENOSPC, fail_at=1):
    """The nth file (from 1) run_utils opens to write whose path ends so fails at its write number fail_at; the
    error at opening it where fail_at is 0 (a mount gone read-only)."""
    opened = []

    def patched_open(path, mode="r", *args, **kwargs):
        if "r" in mode or not str(path).endswith(ending):
            return open(path, mode, *args, **kwargs)
        opened.append(path)
        if len(opened) == nth_file and fail_at == 0:
            raise OSError(error.errno, error.strerror, str(path))
        file = open(path, mode, *args, **kwargs)
        return FailingFile(file, fail_at, error) if len(opened) == nth_file else file

    monkeypatch.setattr(run_utils, "open", patched_open, raising=False)


def check_one_line_and_status(completed, what, path, reason, model, step):
    """WRITE_FAILED, no traceback, and one line: what could not be written, where, why, and the intact checkpoint."""
    assert completed.returncode == run_utils.WRITE_FAILED, describe(completed)
    assert "Traceback" not in completed.stderr + completed.stdout, describe(completed)
    lines = [line for line in completed.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, describe(completed)
    assert f"cannot write the {what} {path}: {reason}" in lines[0], lines
    assert lines[0].endswith(f"intact: the checkpoint of step {step}, {model}"), lines


@pytest.mark.parametrize(("name", "flags", "steps"), SCRIPTS, ids=[name for name, *_ in SCRIPTS])
def test_a_full_disk_at_a_checkpoint_stops_the_run_and_keeps_the_last(name, flags, steps, tmp_path, monkeypatch):
    """The second checkpoint's write fills the disk: the run stops after that step, leaves no temporary file, says
    so in one line (the first checkpoint intact) and in its results line; the first checkpoint is left as written
    (that such a checkpoint resumes is each pair's test_resume_continues_the_run). A world's ranks learn of rank 0's
    failed write at the next iteration's exchange, and stop after that one."""
    stop = 3 * steps if "distributed" in name else 2 * steps
    model, results = tmp_path / "agent.pt", tmp_path / "results.jsonl"
    fail_writes(monkeypatch, ".pt.tmp", nth_file=2)
    flags = (*flags, "--save-model", "--model-path", model, "--results-path", results, "--eval-episodes", "0")
    completed = run_script_in_process(name, *flags, "--total-timesteps", stop + steps, "--checkpoint-every", steps)
    check_one_line_and_status(completed, "checkpoint", model, "No space left on device", model, steps)
    assert sorted(os.listdir(tmp_path)) == ["agent.pt", "results.jsonl"]
    (result,) = read_results(results)
    assert (result["steps_done"], result["interrupted"], result["cut"]) == (stop, True, "training"), result
    assert result["failed_write"] == f"cannot write the checkpoint {model}: No space left on device", result
    assert load_checkpoint(model)["global_step"] == steps


DQN = (*PLAINS["dqn"][0], "--total-timesteps", "300", "--save-model", "--eval-episodes", "2")


def test_a_failed_final_checkpoint_skips_the_evaluation_and_keeps_the_last_one(tmp_path, monkeypatch):
    """The training ends; its final checkpoint cannot be written: no evaluation of an older agent, the mid-run
    checkpoint intact and named, the results line cut at the evaluation with the reason."""
    model, results = tmp_path / "agent.pt", tmp_path / "results.jsonl"
    fail_writes(monkeypatch, ".pt.tmp", nth_file=2, error=EIO, fail_at=2)
    completed = run_script_in_process("dqn", *DQN, "--checkpoint-every", "200", "--model-path", model,
                                      "--results-path", results)  # fmt: skip
    check_one_line_and_status(completed, "checkpoint", model, "Input/output error", model, 200)
    (result,) = read_results(results)
    assert (result["steps_done"], result["cut"], result["eval_return"]) == (300, "evaluation", None), result
    assert "evaluation cut by a failed write" in completed.stdout.splitlines()[-1]
    assert load_checkpoint(model)["global_step"] == 200 and not (tmp_path / "agent.pt.tmp").exists()


def test_a_read_only_results_file_loses_nothing_else(tmp_path, monkeypatch):
    """The results line cannot be written (the mount went read-only): the checkpoint and evaluation are done, the
    line on stderr says what is missing, the exit status says something is."""
    model, results = tmp_path / "agent.pt", tmp_path / "results.jsonl"
    results.write_text('{"earlier": "run"}\n')
    fail_writes(monkeypatch, "results.jsonl", nth_file=1, error=EROFS, fail_at=0)
    completed = run_script_in_process("dqn", *DQN, "--model-path", model, "--results-path", results)
    check_one_line_and_status(completed, "results line", results, "Read-only file system", model, 300)
    assert results.read_text() == '{"earlier": "run"}\n'
    assert load_checkpoint(model)["global_step"] == 300 and "eval return" in completed.stdout


def test_a_video_that_cannot_be_written_cuts_the_evaluation_and_leaves_no_part(tmp_path, monkeypatch):
    """The disk fills while the second episode's video is written: that file goes, the first stays, the evaluation
    is cut and says why."""
    imageio = pytest.importorskip("imageio")
    get_writer = imageio.get_writer
    writers = []

    def failing_writer(path, **kwargs):
        writer = get_writer(path, **kwargs)
        writers.append(writer)
        if len(writers) == 2:  # its third frame does not fit
            frames = []

            def append_data(frame):
                frames.append(frame)
                if len(frames) == 3:
                    writer.close()
                    raise ENOSPC
                type(writer).append_data(writer, frame)

            writer.append_data = append_data
        return writer

    monkeypatch.setattr(imageio, "get_writer", failing_writer)
    model, results = tmp_path / "agent.pt", tmp_path / "results.jsonl"
    completed = run_script_in_process("dqn", *DQN, "--capture-video", "--model-path", model, "--results-path", results)
    video = tmp_path / "videos" / "eval-episode-1.mp4"
    check_one_line_and_status(completed, "video", video, "No space left on device", model, 300)
    assert os.listdir(tmp_path / "videos") == ["eval-episode-0.mp4"]
    (result,) = read_results(results)
    assert (result["cut"], result["eval_return"], result["steps_done"]) == ("evaluation", None, 300), result


def test_episode_record_holds_the_runs_episodes_and_a_resume_keeps_those_up_to_its_checkpoint(
    tmp_path, monkeypatch, saved_checkpoints
):
    """--episodes-path: a line [step, return, seconds] per training episode, step the steps done at its end. A run
    resumed from a mid-run checkpoint (as after a kill past it) keeps the lines up to its step, a half line dropped,
    and goes on, its clock on from the checkpoint's. A record that cannot be written stops the run as a checkpoint."""
    model, record = tmp_path / "agent.pt", tmp_path / "episodes.jsonl"
    flags = (*PLAINS["dqn"][0], "--total-timesteps", 400, "--save-model", "--eval-episodes", "0")
    flags += ("--episodes-path", record)
    run = run_script_in_process("dqn", *flags, "--checkpoint-every", "200", "--model-path", model)
    assert run.returncode == 0, describe(run)
    episodes = [json.loads(line) for line in record.read_text().splitlines()]
    assert sum(episode_return for _, episode_return, _ in episodes) == episodes[-1][0], (
        "CartPole pays 1 a step: the returns add up to the steps done at the last episode's end"
    )
    mid = saved_checkpoints[0]
    before = [episode for episode in episodes if episode[0] <= 200]
    assert mid["global_step"] == 200 and 3 <= len(before) < len(episodes) and before[-1][2] <= mid["run_seconds"]
    torch.save(mid, tmp_path / "mid.pt")
    with open(record, "a") as file:  # a line cut by a kill
        file.write("[410, 1")
    resumed = run_script_in_process("dqn", *flags, "--resume", tmp_path / "mid.pt")
    assert resumed.returncode == 0, describe(resumed)
    after = [json.loads(line) for line in record.read_text().splitlines()]
    assert after[: len(before)] == before and len(after) > len(before)
    assert all(step > 200 and seconds > mid["run_seconds"] for step, _, seconds in after[len(before) :])
    fail_writes(monkeypatch, "episodes.jsonl", nth_file=3)  # the third episode: each opens the file
    failed = run_script_in_process("dqn", *flags, "--model-path", tmp_path / "new.pt")
    step = load_checkpoint(tmp_path / "new.pt")["global_step"]
    check_one_line_and_status(failed, "episode record", record, "No space left on device", tmp_path / "new.pt", step)
    assert step < 400 and len(record.read_text().splitlines()) == 2, "the third episode failed, with no half line"
