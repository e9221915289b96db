"""Where the time of a training loop goes, inside the real loop: SAC and TD3, PPO (Atari and continuous), PQN Atari.

The script is loaded as a module, and the definitions its loop calls are wrapped with timers, in that module. Then
the script's own `__main__` block runs in that module, with the script's flags; its source is not edited. Each
timed call marks the start of a phase and ends the phase the previous mark started, so a phase runs from its call
to the call of the next phase, and holds what the loop does in between. A loop that no longer calls one of these
is an error, not a table. On a GPU the times are the host's: a kernel counts in the phase that waits for it.

SAC and TD3 (make_env's env.step, ReplayBuffer's add and sample, and what build_sac or build_td3 returns):

    act                       policy's call to env.step's (turning the action into numpy included)
    env step                  env.step's call to add's
    store                     ReplayBuffer.add's call to sample's (an episode's end included)
    sample                    ReplayBuffer.sample's call to update_critic's
    critic update             update_critic's call to update_actor's, update_targets' or the next step's policy's
    actor and target updates  update_actor's (or update_targets') call to the next step's policy call (the
                              logging, the step's bookkeeping and turning the next observation into a tensor)

A training step runs from one policy call to the next; the first 100 are left out (compilation), the step the
loop ends in too, and the times are microseconds per training step. Phases timed in isolation
(benchmarks/micro_benchmark.py) look faster: between updates the CPU caches are cold, which slows the small
phases of the loop.

PPO and PQN Atari (the vector env's step and close, and what build_ppo or build_pqn returns):

    act          policy's call to the envs' step (turning the actions into numpy included)
    env step     the envs' step, from its call to its return
    bookkeeping  the step's return to the next policy call, or to gae's (q_lambda_returns') after the rollout's
                 last step: the episodes' returns, the observation into a tensor, stacking the rollout and the
                 value of the observation that follows it
    advantages   gae's (q_lambda_returns') call to the first update's: the advantages or returns, flattening
    update       the first update's call to the next rollout's first policy call (or the envs' close): every
                 epoch's shuffle and every minibatch's update, the logging and a checkpoint

An iteration (a rollout and its update) runs from its first policy call to the next iteration's; the first 3
are left out (compilation), and the times are milliseconds per iteration, with the sps they add up to.

    python benchmarks/loop_breakdown.py sac_continuous_action                     # the plain script
    python benchmarks/loop_breakdown.py sac_continuous_action_torchcompile --compile
    python benchmarks/loop_breakdown.py ppo_atari_envpool_torchcompile --compile
"""

import ast
import importlib.util
import sys
import time
from collections import defaultdict
from pathlib import Path

import gymnasium as gym
import tyro

ROOT = Path(__file__).resolve().parent.parent
END = "envs.close"  # the call that ends the last iteration of an on-policy loop
# Each family of scripts: the scripts' prefixes, the phases in the loop's order, each with the calls that start it
# (the first call starts a training step or iteration), what the agent must return and the units left out at the
# start; off-policy, the budget flags too (placed before the user's, which win).
OFF_POLICY = dict(
    prefixes=("sac_", "td3_"),
    phases={
        "act": ("agent.policy",),
        "env step": ("env.step",),
        "store": ("ReplayBuffer.add",),
        "sample": ("ReplayBuffer.sample",),
        "critic update": ("agent.update_critic",),
        "actor and target updates": ("agent.update_actor", "agent.update_targets"),
    },
    agent_calls=("policy", "update_critic", "update_actor", "update_targets"),
    skipped=100,
    budget=("--learning-starts", "1000", "--total-timesteps", "3000"),  # 1,899 timed training steps
)
# An on-policy script's advantages (or returns): its agent's function, or the plain script's module-level one.
ADVANTAGES = ("agent.gae", "agent.q_lambda_returns", "compute_advantages", "compute_q_lambda_returns")
ON_POLICY = dict(
    prefixes=("ppo_atari_envpool", "ppo_continuous_action", "pqn_atari_envpool"),
    phases={
        "act": ("agent.policy",),
        "env step": ("envs.step",),
        "bookkeeping": ("envs.step returned",),
        "advantages": ADVANTAGES,
        "update": ("agent.update",),
    },
    agent_calls=("policy", "update"),
    skipped=3,  # and 3 timed: the budget is 6 iterations of the script's batch
)


def error(message):
    sys.exit(f"loop_breakdown.py: error: {message}")


class Breakdown:
    """The seconds of each phase summed over the timed training steps (iterations), from the timed calls' marks."""

    def __init__(self, family):
        self.phases, self.skipped = family["phases"], family["skipped"]
        self.on_policy = family is ON_POLICY
        self.seconds = defaultdict(float)
        self.called = set()  # the calls made
        self.step_seconds = defaultdict(float)  # the step in progress
        self.phase = self.since = None
        self.training_steps = self.timed_steps = 0  # started, and finished and timed

    def mark(self, phase, call):
        now = time.perf_counter()
        if self.phase:
            self.step_seconds[self.phase] += now - self.since
        # A step starts at a policy call (an iteration: at the first of its rollout); the one before is finished.
        starts = call == "agent.policy" and (not self.on_policy or self.phase in (None, "update"))
        if starts or call == END:
            if self.training_steps > self.skipped:
                for name, seconds in self.step_seconds.items():
                    self.seconds[name] += seconds
                self.timed_steps += 1
            self.training_steps += starts
            self.step_seconds = defaultdict(float)
        self.called.add(call)
        self.phase, self.since = phase, now

    def timed(self, function, call, returned=None):
        """function, marking its call (and its return, as the call `returned`)."""
        phase = next(phase for phase, calls in self.phases.items() if call in calls)
        returned_phase = next((phase for phase, calls in self.phases.items() if returned in calls), None)

        def timed_call(*args, **kwargs):
            self.mark(phase, call)
            result = function(*args, **kwargs)
            if returned:
                self.mark(returned_phase, returned)
            return result

        return timed_call


def wrap_agent(module, build_name, calls, timings, then=None):
    """Wrap, in the script's module, the build function: the named functions of what it returns are timed (and
    then(agent) is called, if given)."""
    build = getattr(module, build_name)

    def timed_build(*args, **kwargs):
        agent = build(*args, **kwargs)
        for name in calls:
            if not hasattr(agent, name):
                error(f"{build_name}() of {Path(module.__file__).name} returns no {name}")
            setattr(agent, name, timings.timed(getattr(agent, name), f"agent.{name}"))
        if then:
            then(agent)
        return agent

    setattr(module, build_name, timed_build)


def instrument_off_policy(module, build_name, timings):
    """Wrap make_env (its env's step), ReplayBuffer (add and sample) and the build function."""
    missing = [name for name in ("make_env", "ReplayBuffer", build_name) if not hasattr(module, name)]
    if missing:
        error(f"{Path(module.__file__).name} defines no {', '.join(missing)}: the breakdown times the calls of these")
    make_env, replay_buffer = module.make_env, module.ReplayBuffer

    def timed_make_env(*args, **kwargs):
        env = make_env(*args, **kwargs)
        env.step = timings.timed(env.step, "env.step")
        return env

    def timed_replay_buffer(*args, **kwargs):
        buffer = replay_buffer(*args, **kwargs)
        buffer.add = timings.timed(buffer.add, "ReplayBuffer.add")
        buffer.sample = timings.timed(buffer.sample, "ReplayBuffer.sample")
        return buffer

    module.make_env, module.ReplayBuffer = timed_make_env, timed_replay_buffer
    wrap_agent(module, build_name, OFF_POLICY["agent_calls"], timings)


def instrument_on_policy(module, build_name, timings):
    """Wrap the vector env's step and close (make_envs' envpool envs, or gymnasium's SyncVectorEnv) and the agent."""
    if not hasattr(module, build_name):
        error(f"{Path(module.__file__).name} defines no {build_name}: the breakdown times the calls of what it returns")

    def wrap_envs(envs):
        envs.step = timings.timed(envs.step, "envs.step", returned="envs.step returned")
        close = envs.close
        envs.close = lambda: (timings.mark(None, END), close())[1]
        return envs

    if hasattr(module, "make_envs"):  # envpool: the script makes its vector env in make_envs
        make_envs = module.make_envs
        module.make_envs = lambda *args, **kwargs: wrap_envs(make_envs(*args, **kwargs))
    else:  # gymnasium: the script's __main__ block makes a SyncVectorEnv; this process's class is changed
        init = gym.vector.SyncVectorEnv.__init__
        gym.vector.SyncVectorEnv.__init__ = lambda envs, *args, **kwargs: (
            init(envs, *args, **kwargs),
            wrap_envs(envs),
        )[0]

    def time_advantages(agent):  # a twin's compiled gae calls the module's function: that one is not timed
        name = next((name for name in ("gae", "q_lambda_returns") if hasattr(agent, name)), None)
        if name:
            setattr(agent, name, timings.timed(getattr(agent, name), f"agent.{name}"))
        else:
            for name in ("compute_advantages", "compute_q_lambda_returns"):
                if hasattr(module, name):
                    setattr(module, name, timings.timed(getattr(module, name), name))

    wrap_agent(module, build_name, ON_POLICY["agent_calls"], timings, then=time_advantages)


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
    """Run the script at path with flags, timed, and print the time per training step (iteration) of each phase;
    returns the Breakdown."""
    family = ON_POLICY if path.stem.startswith(ON_POLICY["prefixes"]) else OFF_POLICY
    sys.path.insert(0, str(path.parent))  # scripts import run_utils from their folder
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses and tyro look the Args class's module up here
    spec.loader.exec_module(module)  # the definitions only: the run is the __main__ block
    timings = Breakdown(family)
    build_name = f"build_{path.stem.split('_')[0]}"
    if family is ON_POLICY:
        # 6 iterations, the first 3 left out; the flags are parsed here only for the batch size.
        args = tyro.cli(module.Args, args=flags)
        batch_size = args.num_envs * args.num_steps
        budget = ["--total-timesteps", str((family["skipped"] + 3) * batch_size)]
        instrument_on_policy(module, build_name, timings)
    else:
        budget = list(family["budget"])
        instrument_off_policy(module, build_name, timings)
    code = main_block(path)
    module.__name__ = "__main__"
    sys.argv = [str(path), *budget, *flags]
    exec(code, vars(module))

    unit = "iteration" if family is ON_POLICY else "training step"
    if timings.training_steps == 0:
        error(f"the training loop of {path.name} does not call agent.policy")
    missing = [call for calls in family["phases"].values() for call in calls if call not in timings.called]
    missing = [call for call in missing if call != "envs.step returned"]  # not a call: the return of envs.step
    if family is ON_POLICY and set(ADVANTAGES) & timings.called:  # a script calls one of these
        missing = [call for call in missing if call not in ADVANTAGES]
    if missing:
        error(f"the training loop of {path.name} does not call {', '.join(missing)}: its phases cannot be timed")
    if timings.timed_steps == 0:
        untimed = f"the first {family['skipped']}" + ("" if family is ON_POLICY else " and the last")
        error(f"{timings.training_steps} {unit}s are too few: {untimed} are not timed")
    per_step = {phase: timings.seconds[phase] / timings.timed_steps for phase in family["phases"]}
    total = sum(per_step.values())
    if family is ON_POLICY:
        for phase, seconds in per_step.items():
            print(f"{phase:>26}: {seconds * 1e3:7.1f} ms per iteration ({seconds / total:4.0%})")
        print(f"{'sum':>26}: {total * 1e3:7.1f} ms per iteration ({batch_size / total:.0f} sps)")
    else:
        for phase, seconds in per_step.items():
            print(f"{phase:>26}: {seconds * 1e6:7.0f} us per step")
        print(f"{'sum':>26}: {total * 1e6:7.0f} us per step")
    return timings


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    script, flags = sys.argv[1], sys.argv[2:]
    path = ROOT / "leanrl" / f"{script}.py"
    if not script.startswith(OFF_POLICY["prefixes"] + ON_POLICY["prefixes"]) or not path.exists():
        error(f"{script!r} is not a SAC, TD3, PPO or PQN Atari script of leanrl/")
    breakdown(path, flags)


if __name__ == "__main__":
    main()
