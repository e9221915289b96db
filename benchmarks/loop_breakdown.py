"""Where a training step of SAC or TD3 spends its time, inside the real training loop.

The script is loaded as a module, and the definitions its loop calls are wrapped with timers, in that module:
make_env (the env's step), ReplayBuffer (add and sample) and build_sac or build_td3 (policy, update_critic,
update_actor and update_targets of what it returns). Then the script's own `__main__` block runs in that module,
with the script's flags; its source is not edited. Each timed call marks the start of a phase and ends the phase
the previous mark started, so a phase runs from its call to the call of the next phase, and holds what the loop
does in between:

    act                       policy's call to env.step's (turning the action into numpy included)
    env step                  env.step's call to add's
    store                     ReplayBuffer.add's call to sample's (an episode's end included)
    sample                    ReplayBuffer.sample's call to update_critic's
    critic update             update_critic's call to update_actor's, update_targets' or the next step's policy's
    actor and target updates  update_actor's (or update_targets') call to the next step's policy call (the
                              logging, the step's bookkeeping and turning the next observation into a tensor)

A loop that no longer calls one of these is an error, not a table. A training step runs from one policy call to
the next; the first 100 are left out (compilation), the step the loop ends in too, and the times are microseconds
per training step. On a GPU they are the host's times: a kernel counts in the phase that waits for it. Phases
timed in isolation (benchmarks/micro_benchmark.py) look faster: between updates the CPU caches are cold, which
slows the small phases of the loop.

    python benchmarks/loop_breakdown.py sac_continuous_action                     # the plain script
    python benchmarks/loop_breakdown.py sac_continuous_action_torchcompile --compile
"""

import ast
import importlib.util
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_STEPS = 100  # training steps left out at the start: compilation and warm-up
# The phases in the loop's order, each with the calls that start it (the first one starts a training step);
# agent is what build_sac or build_td3 returns.
PHASES = {
    "act": ("agent.policy",),
    "env step": ("env.step",),
    "store": ("ReplayBuffer.add",),
    "sample": ("ReplayBuffer.sample",),
    "critic update": ("agent.update_critic",),
    "actor and target updates": ("agent.update_actor", "agent.update_targets"),
}


def error(message):
    sys.exit(f"loop_breakdown.py: error: {message}")


class Breakdown:
    """The seconds of each phase summed over the timed training steps, from the marks of the timed calls."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.called = set()  # the calls made in the timed steps
        self.step_seconds, self.step_called = defaultdict(float), set()  # the step in progress
        self.phase = self.since = None
        self.training_steps = self.timed_steps = 0  # started, and finished and timed

    def mark(self, phase, call):
        now = time.perf_counter()
        if self.phase:
            self.step_seconds[self.phase] += now - self.since
        if call == "agent.policy":  # a training step starts: the one before it is finished
            if self.training_steps > SKIPPED_STEPS:
                for name, seconds in self.step_seconds.items():
                    self.seconds[name] += seconds
                self.called |= self.step_called
                self.timed_steps += 1
            self.training_steps += 1
            self.step_seconds, self.step_called = defaultdict(float), set()
        self.step_called.add(call)
        self.phase, self.since = phase, now

    def timed(self, function, call):
        phase = next(phase for phase, calls in PHASES.items() if call in calls)

        def timed_call(*args, **kwargs):
            self.mark(phase, call)
            return function(*args, **kwargs)

        return timed_call


def instrument(module, build_name, timings):
    """Wrap, in the script's module, make_env, ReplayBuffer and the build function with the timed calls."""
    missing = [name for name in ("make_env", "ReplayBuffer", build_name) if not hasattr(module, name)]
    if missing:
        error(f"{Path(module.__file__).name} defines no {', '.join(missing)}: the breakdown times the calls of these")
    make_env, replay_buffer, build = module.make_env, module.ReplayBuffer, getattr(module, build_name)

    def timed_make_env(*args, **kwargs):
        env = make_env(*args, **kwargs)
        env.step = timings.timed(env.step, "env.step")
        return env

    def timed_replay_buffer(*args, **kwargs):
        buffer = replay_buffer(*args, **kwargs)
        buffer.add = timings.timed(buffer.add, "ReplayBuffer.add")
        buffer.sample = timings.timed(buffer.sample, "ReplayBuffer.sample")
        return buffer

    def timed_build(*args, **kwargs):
        agent = build(*args, **kwargs)
        for name in ("policy", "update_critic", "update_actor", "update_targets"):
            if not hasattr(agent, name):
                error(f"{build_name}() of {Path(module.__file__).name} returns no {name}")
            setattr(agent, name, timings.timed(getattr(agent, name), f"agent.{name}"))
        return agent

    module.make_env, module.ReplayBuffer = timed_make_env, timed_replay_buffer
    setattr(module, build_name, timed_build)


def main_block(path):
    """The body of the script's `if __name__ == "__main__":` block, compiled with the script's file name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    blocks = [
        node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
    ]
    if len(blocks) != 1:
        error(f'{path.name} has {len(blocks)} `if __name__ == "__main__":` blocks, not one')
    return compile(ast.Module(body=blocks[0].body, type_ignores=[]), str(path), "exec")


def breakdown(path, flags):
    """Run the script at path with flags, timed, and print the microseconds per training step of each phase."""
    sys.path.insert(0, str(path.parent))  # scripts import run_utils from their folder
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses and tyro look the Args class's module up here
    spec.loader.exec_module(module)  # the definitions only: the run is the __main__ block
    timings = Breakdown()
    instrument(module, f"build_{path.stem.split('_')[0]}", timings)
    code = main_block(path)
    module.__name__ = "__main__"
    sys.argv = [str(path), *flags]
    exec(code, vars(module))

    if timings.training_steps == 0:
        error(f"the training loop of {path.name} does not call agent.policy")
    if timings.timed_steps == 0:
        error(
            f"{timings.training_steps} training steps are too few: the first {SKIPPED_STEPS} and the last are not timed"
        )
    missing = [call for calls in PHASES.values() for call in calls if call not in timings.called]
    if missing:
        error(f"the training loop of {path.name} does not call {', '.join(missing)}: its phases cannot be timed")
    for phase in PHASES:
        print(f"{phase:>26}: {timings.seconds[phase] / timings.timed_steps * 1e6:7.0f} us per step")
    print(f"{'sum':>26}: {sum(timings.seconds.values()) / timings.timed_steps * 1e6:7.0f} us per step")


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    script, flags = sys.argv[1], sys.argv[2:]
    path = ROOT / "leanrl" / f"{script}.py"
    if not script.startswith(("sac_", "td3_")) or not path.exists():
        error(f"{script!r} is not a SAC or TD3 script of leanrl/")
    budget = ["--learning-starts", "1000", "--total-timesteps", "3000"]  # 1,899 timed training steps
    breakdown(path, [*budget, *flags])


if __name__ == "__main__":
    main()
