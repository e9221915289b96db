"""Checks the pairs' tests call on their own scripts: updates that match (plain and twin, eager and compiled, bf16 and
fp32, a second build), bad input, learning and resuming. helpers.py runs and loads the scripts."""

import ast
import statistics

import pytest
import run_utils
import torch
from helpers import (
    load_checkpoint,
    load_script,
    optimizer_steps,
    run_in_process,
    run_in_process_until,
    run_main,
    script_path,
)
from tensordict import TensorDict, TensorDictBase

# float32 tolerances for "the same computation, differently fused".
RTOL, ATOL = 1e-4, 1e-5


def leaves(tensordict):
    """{flattened key: detached clone} of every leaf of a TensorDict (parameters or losses)."""
    return {key: value.detach().clone() for key, value in named_tensors(tensordict).items()}


def assert_leaves_close(actual, expected, what, rtol=RTOL, atol=ATOL):
    """Two {name: tensor} dicts have the same keys and tensors equal within rtol and atol."""
    assert actual.keys() == expected.keys(), f"{what}: keys differ: {sorted(actual)} vs {sorted(expected)}"
    for key in expected:
        torch.testing.assert_close(
            actual[key], expected[key], rtol=rtol, atol=atol, msg=lambda m, k=key: f"{what} {k}: {m}"
        )


def assert_changed(before, after, what):
    """At least one tensor of a group moved: the update is not a no-op."""
    assert any(not torch.equal(before[key], after[key]) for key in before), f"{what} did not change"


def random_batch(batch_size, obs_dim, action_dim, seed, device="cpu"):
    """A replay batch (TensorDict) of random transitions, a quarter of them terminations; actions in [-1, 1]."""
    generator = torch.Generator().manual_seed(seed)
    return TensorDict(
        observations=torch.randn(batch_size, obs_dim, generator=generator),
        next_observations=torch.randn(batch_size, obs_dim, generator=generator),
        actions=torch.rand(batch_size, action_dim, generator=generator) * 2 - 1,
        rewards=torch.randn(batch_size, generator=generator),
        terminations=(torch.rand(batch_size, generator=generator) < 0.25).float(),
        batch_size=[batch_size],
    ).to(device)


# --- Two implementations of one update, compared on any CPU, GPU and thread count (issue 13) ---------------------
#
# Two correct implementations sum in different orders: their gradients differ in the last bits, and where a gradient
# is at its own rounding noise (a near-cancelling sum), so is Adam's normalised step, lr * m / (sqrt(v) + eps), of that
# entry: up to 2 lr apart. So each round, from bit-identical parameters, the checks compare the losses and gradients
# with float32 tolerances, the steps of the entries whose gradients agree to NOISE_LEVEL within a hundredth of a step,
# the others (at most MAX_NOISY_FRACTION) within 2 lr, then copy one side's parameters into the other. A wrong loss or
# gradient fails at once, a wrong optimizer (learning rate, eps, a missing step) in the steps of the bulk.

GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5  # GRAD_ATOL is relative to the tensor's largest gradient (its scale)
NOISE_LEVEL = 1e-3  # two gradients of an entry further apart than this, relatively, are at their rounding noise
STEP_ATOL = 1e-2  # times the learning rate: how far the steps of two matching updates may differ
PARAM_RTOL = 2e-6  # the rounding of the parameter itself (two ulps of float32) when the step is added
MAX_NOISY_FRACTION = 1e-2  # the share of a group's entries allowed to be at their noise: the bulk must match


def named_tensors(source):
    """{name: tensor}, the tensors themselves (not copies): a module's parameters, a TensorDict's leaves, a dict."""
    if isinstance(source, TensorDictBase):  # first: TensorDictParams is a module too
        return {
            ".".join(key) if isinstance(key, tuple) else key: value
            for key, value in source.items(include_nested=True, leaves_only=True)
        }
    if isinstance(source, torch.nn.Module):
        return dict(source.named_parameters())
    return dict(source)


def sync_(actual, expected):
    """Copy expected's values into actual's tensors, in place (a captured graph reads those very tensors)."""
    actual, expected = named_tensors(actual), named_tensors(expected)
    assert actual.keys() == expected.keys(), f"keys differ: {sorted(actual)} vs {sorted(expected)}"
    with torch.no_grad():
        for key, tensor in actual.items():
            tensor.copy_(expected[key])


class SameUpdates:
    """Checks, round after round, that two agents made the same optimizer update of one group of parameters.

    check(actual, expected, lr, what) right after both updated from bit-identical parameters (re-synced after each
    check): the live parameters (a module, a TensorDict or a {name: parameter} dict), .grad holding the gradients
    used; lr a float or {name: float}. grads=False where actual's .grad is not written yet (the call that records a
    CUDA graph): the steps are then checked against the entries found at their noise so far."""

    def __init__(self, group):
        self.group = group
        self.noisy = {}  # {name: bool tensor}: entries whose gradient has been at its rounding noise in some round

    def check(self, actual, expected, lr, what, grads=True):
        actual, expected = named_tensors(actual), named_tensors(expected)
        what = f"{what} {self.group}"
        assert actual.keys() == expected.keys(), f"{what}: keys differ: {sorted(actual)} vs {sorted(expected)}"
        for name, param in expected.items():
            other = actual[name]
            lr_ = lr[name] if isinstance(lr, dict) else float(lr)
            if not grads or (param.grad is None and other.grad is None):
                noisy = torch.zeros_like(param, dtype=torch.bool)
            elif param.grad is None or other.grad is None:
                raise AssertionError(f"{what} {name}: a gradient on one side only")
            else:
                grad, other_grad = param.grad.detach(), other.grad.detach()
                scale = grad.abs().max().item()
                torch.testing.assert_close(
                    other_grad, grad, rtol=GRAD_RTOL, atol=GRAD_ATOL * scale,
                    msg=lambda m, n=name: f"{what} gradient of {n}: {m}",
                )  # fmt: skip
                noisy = (other_grad - grad).abs() > NOISE_LEVEL * torch.maximum(other_grad.abs(), grad.abs())
            self.noisy[name] = noisy | self.noisy.get(name, torch.zeros_like(noisy))
            gap = (other.detach() - param.detach()).abs()
            allowed = STEP_ATOL * lr_ + PARAM_RTOL * param.detach().abs()
            wrong = (gap > allowed) & ~self.noisy[name]
            if wrong.any():
                index = torch.where(wrong, gap - allowed, -1).argmax()
                raise AssertionError(
                    f"{what} {name}: {int(wrong.sum())} of {param.numel()} entries with matching gradients made "
                    f"other steps; greatest gap {gap.flatten()[index]:.3g} where {allowed.flatten()[index]:.3g} is "
                    f"allowed (lr {lr_:.3g})"
                )
            assert gap.max() <= 2 * lr_ + allowed.max(), (
                f"{what} {name}: an entry at its gradient's rounding noise moved {gap.max():.3g} from the other "
                f"side's, more than Adam's two steps of {lr_:.3g}"
            )
        noisy = sum(int(mask.sum()) for mask in self.noisy.values())
        total = sum(mask.numel() for mask in self.noisy.values())
        assert noisy <= MAX_NOISY_FRACTION * total, f"{what}: {noisy} of {total} gradients at their rounding noise"
        sync_(actual, expected)


def assert_params_close_after_steps(actual, expected, lrs, what):
    """Two agents' parameters after the same optimizer steps (learning rates lrs) from the same start, gradients
    unseen: the bulk agree to a hundredth of the steps' total, the rest (at most MAX_NOISY_FRACTION) within Adam's."""
    actual, expected = named_tensors(actual), named_tensors(expected)
    assert actual.keys() == expected.keys(), f"{what}: keys differ: {sorted(actual)} vs {sorted(expected)}"
    loose, total = 0, 0
    for name, param in expected.items():
        gap = (actual[name].detach() - param.detach()).abs()
        loose += int((gap > STEP_ATOL * sum(lrs) + PARAM_RTOL * param.detach().abs()).sum())
        total += param.numel()
        assert gap.max() <= 2 * sum(lrs), f"{what} {name}: {gap.max():.3g} apart, more than Adam's steps allow"
    assert loose <= MAX_NOISY_FRACTION * total, f"{what}: {loose} of {total} entries further apart than the bulk's"


# --- Bad input: exit status 2, one clear line ---------------------------------------------------------------------


def check_bad_input_in_process(name, flags, expected_words, tmp_path, capsys):
    """A run of the script in this process with these flags exits 2 with exactly one stderr line naming the problem
    (each expected word in it) and writes no results. Anything but SystemExit (a traceback) fails the test."""
    results = tmp_path / "results.jsonl"
    with pytest.raises(SystemExit) as exit_:
        run_main(name, (*flags, "--results-path", results), None, cuda=False)
    stdout, stderr = capsys.readouterr()
    assert exit_.value.code == 2, (exit_.value.code, stdout, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{name}.py: error: "), lines
    for word in expected_words:
        assert word in lines[0].replace("_", "-"), f"{word!r} not in {lines[0]!r}"
    assert not results.exists(), "a failed run wrote results"


def check_bf16_update_is_fp32_within_rounding(builds, update, network, batches, value, variants=("eager",), obs="obs"):
    """One update from the same parameters on the same minibatch under bf16 autocast (each of the variants, eager or
    compiled) is the fp32 update within bf16's rounding: losses and acting's values to 5% (+0.02), each gradient's
    cosine with fp32's above 0.99 (another minibatch's is not), weights and gradients still fp32. builds(**overrides)
    -> a twin's agent (the same parameters each time), update(agent, batch) -> losses, network(agent) -> its module,
    value(agent, obs) -> acting's values (of the batch's `obs` entry)."""
    fp32, bf16s = builds(), {label: builds(bf16=True, compile=label == "compiled") for label in variants}
    losses = detached(update(fp32, batches[0]))
    grads = {name: param.grad.clone() for name, param in network(fp32).named_parameters()}
    dtypes = {name: tensor.dtype for name, tensor in network(fp32).state_dict().items()}
    other = builds()
    update(other, batches[1])
    other_cosines = [cosine(param.grad, grads[name]) for name, param in network(other).named_parameters()]
    assert min(other_cosines) < 0.99, "another minibatch's gradients pass the check: it proves nothing"
    for label, bf16 in bf16s.items():
        bf16_losses = detached(update(bf16, batches[0]))
        assert_leaves_close(bf16_losses, losses, f"bf16 {label} losses", rtol=0.05, atol=0.02)
        for name, param in network(bf16).named_parameters():
            assert param.grad.dtype == torch.float32, (name, param.grad.dtype)
            assert cosine(param.grad, grads[name]) > 0.99, f"bf16 {label}: {name}'s gradient is off the fp32 one's"
        torch.testing.assert_close(value(bf16, batches[0][obs]), value(fp32, batches[0][obs]), rtol=0.05, atol=0.02)
        assert {name: tensor.dtype for name, tensor in network(bf16).state_dict().items()} == dtypes


# --- SAC's and TD3's twins, whose namespaces are alike (update_critic, update_actor, update_targets, policy) ---


def off_policy_update(agent, batch):
    """SAC's or TD3's twin's critic and actor updates, the noise they draw seeded alike for every agent."""
    torch.manual_seed(5)
    losses = agent.update_critic(batch)
    losses.update(agent.update_actor(batch))
    return losses


def check_off_policy_bf16_update_is_fp32_within_rounding(build, obs_dim, action_dim, device):
    """check_bf16_update_is_fp32_within_rounding for SAC's or TD3's twin (build(**overrides) -> its agent), eager
    and compiled: the critic and actor updates on a batch of 256, and acting."""

    def policy(agent, obs):
        torch.manual_seed(6)
        return agent.policy(obs)

    check_bf16_update_is_fp32_within_rounding(
        build,
        off_policy_update,
        lambda agent: torch.nn.ModuleList([agent.qnet_params, agent.actor]),
        [random_batch(256, obs_dim, action_dim, seed=s, device=device) for s in (500, 501)],
        policy,
        variants=("eager", "compiled"),
        obs="observations",
    )


def off_policy_compiled_calls(build, snapshot, obs_dim, action_dim, batch_size):
    """compiled_calls of SAC's or TD3's twin for check_a_second_build_computes_with_its_own_hyperparameters: acting,
    the updates on one batch. build(module, **overrides) -> the agent, snapshot(agent) -> {group: {name: tensor}}."""

    def compiled_calls(module, **overrides):
        agent = build(module, **overrides)
        batch = random_batch(batch_size, obs_dim, action_dim, seed=77)
        torch.manual_seed(8)
        actions = agent.policy(batch["observations"])
        losses = off_policy_update(agent, batch)
        agent.update_targets()
        return flat(actions=actions, losses=losses, **snapshot(agent))

    return compiled_calls


def check_bf16_td_errors_near_fp32_at_large_q_values(build, obs_dim, action_dim, monkeypatch, samples=32):
    """SAC's and TD3's --bf16 critic update at Q values near 1000 (HalfCheetah's late in a run), TD errors about 10:
    each sample's TD error (root of a batch of one's critic loss) is fp32's within 2%, as the Q heads are fp32; with
    the heads in bf16 (which rounds 1000 to a multiple of 4) it misses by far more. build(**overrides) -> a twin's
    agent, the same parameters each time, learning rate 0."""
    import twin_utils

    def td_errors(agent):
        with torch.no_grad():
            for params in (agent.qnet_params.data, agent.target_qnet_params):
                params["fc2", "weight"][:, 0] = 0.0  # hidden unit 0 is relu(0 + 1) = 1 for any input
                params["fc2", "bias"][:, 0] = 1.0
                params["fc3", "weight"].mul_(50.0)  # the other units: a spread of about 10 around 1000
                params["fc3", "weight"][:, 0, 0] = 1000.0
                params["fc3", "bias"].zero_()
        errors = []
        for sample in range(samples):
            batch = random_batch(1, obs_dim, action_dim, seed=sample)
            batch["rewards"] = batch["rewards"] + 10.0  # a HalfCheetah step's reward: about 10
            batch["terminations"].zero_()
            torch.manual_seed(sample)  # SAC's next actions, TD3's target smoothing noise
            errors.append(agent.update_critic(batch)["qf_loss"].sqrt())
        return torch.stack(errors)

    fp32 = td_errors(build())
    assert 3 < fp32.norm() / samples**0.5 < 30, f"TD errors of {fp32.norm() / samples**0.5:.1f}, not about 10"
    bf16 = td_errors(build(bf16=True))
    assert (bf16 - fp32).norm() / fp32.norm() < 0.02, ((bf16 - fp32).norm() / fp32.norm(), fp32, bf16)
    monkeypatch.setattr(twin_utils, "fp32_layer", lambda layer, x: layer(x))
    bf16_heads = td_errors(build(bf16=True))
    assert (bf16_heads - fp32).norm() / fp32.norm() > 0.05, "bf16 heads pass too: the check proves nothing"


def check_bf16_layers_of_sac_td3_networks(module, q_network, obs_dim, action_dim):
    """Under --bf16's autocast, SAC's and TD3's networks compute their first layer (of observations and actions) and
    last layers in fp32, the hidden layer between them in bf16: each Linear's output dtype, read by hooks."""
    bound = torch.ones(action_dim)
    q, actor = getattr(module, q_network)(obs_dim, action_dim), module.Actor(obs_dim, action_dim, -bound, bound)
    dtypes = {}
    for label, network in {"Q": q, "actor": actor}.items():
        for name, layer in network.named_modules():
            if isinstance(layer, torch.nn.Linear):
                hook = lambda _layer, _inputs, out, key=f"{label}.{name}": dtypes.__setitem__(key, out.dtype)  # noqa: E731
                layer.register_forward_hook(hook)
    obs, actions = torch.randn(4, obs_dim), torch.rand(4, action_dim) * 2 - 1
    with torch.autocast("cpu", torch.bfloat16):
        q(obs, actions)
        actor(obs)
    hidden = {"Q.fc2", "actor.fc2"}
    expected = {key: torch.bfloat16 if key in hidden else torch.float32 for key in dtypes}
    assert dtypes == expected and hidden < set(dtypes) and len(dtypes) > 4, dtypes


# --- A second build in the same process computes with its own hyper-parameters (issue 70) ---------------------
# dynamo's cache is per code object, shared by every build of a twin in a process: a second build reuses the first's
# graphs where the guards see no change, with the hyper-parameters read from the closure baked in.


def compiled_hyperparameters(name):
    """The Args fields that a twin's compiled or captured functions read, from its code: in its build_* function, the
    nested functions handed to torch.compile or CudaGraphModule and those they call, their `args.<field>` reads."""
    tree = ast.parse(script_path(name).read_text())
    fields = set()
    for build in (node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("build")):
        nested = {
            node.name: node for node in ast.walk(build) if isinstance(node, ast.FunctionDef) and node is not build
        }
        wrapped = [
            node.args[0].id
            for node in ast.walk(build)
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.compile", "CudaGraphModule")
            and node.args and isinstance(node.args[0], ast.Name)
        ]  # fmt: skip
        seen = set()
        while wrapped:
            function = wrapped.pop()
            if function in nested and function not in seen:
                seen.add(function)
                wrapped += [node.id for node in ast.walk(nested[function]) if isinstance(node, ast.Name)]
        fields |= {
            node.attr
            for function in seen
            for node in ast.walk(nested[function])
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args"
        }
    return fields - {"compile", "cudagraphs"}


def other_value(value, domain):
    """A value of the hyper-parameter other than its default, in its domain: a flag flipped, an integer plus one, a
    float halved (0.5 for 0)."""
    if isinstance(value, bool):
        return not value
    other = value + 1 if isinstance(value, int) else value / 2 if value else 0.5
    assert domain is None or run_utils.in_domain(other, domain), (value, other, domain)
    return other


def flat(**groups):
    """{group.key: a detached copy} of tensors, sequences, dicts of tensors and TensorDicts: one dict to compare."""
    out = {}
    for group, value in groups.items():
        if isinstance(value, torch.Tensor):
            value = {"": value}
        elif isinstance(value, (tuple, list)):
            value = dict(enumerate(value))
        elif isinstance(value, TensorDictBase):
            value = leaves(value)
        out.update({f"{group}.{key}".rstrip("."): tensor.detach().clone() for key, tensor in value.items()})
    return out


def check_a_second_build_computes_with_its_own_hyperparameters(name, compiled_calls):
    """A twin built with --compile and its defaults and called, then built again in the same process with every
    hyper-parameter its compiled functions read at another value (which changes what it computes), computes what the
    eager twin built with those values does (within bf16's rounding where --bf16 is among them). compiled_calls(module,
    **overrides) -> {name: tensor}: a build's compiled functions called on seeded inputs, outputs and parameters."""
    module = load_script(name)
    domains = {**run_utils.RUN_DOMAINS, **getattr(module, "DOMAINS", {})}
    defaults = module.Args()
    fields = compiled_hyperparameters(name)
    assert fields, f"{name}: no hyper-parameter read by its compiled functions was found"
    others = {field: other_value(getattr(defaults, field), domains.get(field)) for field in sorted(fields)}
    compiled_calls(module, compile=True)  # the first build: its graphs traced with the defaults
    second = compiled_calls(module, compile=True, **others)
    eager = compiled_calls(module, compile=False, **others)
    tolerance = dict(rtol=0.05, atol=0.02) if others.get("bf16") else dict(rtol=RTOL, atol=ATOL)
    assert second.keys() == eager.keys(), f"{name}'s second build, with {others}: {second.keys() ^ eager.keys()}"
    assert_leaves_close(second, eager, f"{name}'s second build, with {others}", **tolerance)
    with pytest.raises(AssertionError):
        assert_leaves_close(compiled_calls(module, compile=False), eager, "the defaults' calls", **tolerance)


def cosine(x, y):
    return torch.nn.functional.cosine_similarity(x.flatten(), y.flatten(), dim=0)


def detached(losses):
    """An update's losses, detached and copied: later updates do not change them."""
    return {key: value.detach().clone() for key, value in losses.items()}


# --- Checkpoints, evaluation and interruption: --save-model, --resume, --eval-episodes, --capture-video --------


def assert_same_state(actual, expected, where="checkpoint"):
    """Two checkpoints (or parts of them) hold the same entries: tensors equal in dtype, shape and every value."""
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys(), f"{where}: keys {sorted(actual)} vs {sorted(expected)}"
        for key in expected:
            assert_same_state(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), f"{where}: length {len(actual)} vs {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same_state(a, e, f"{where}[{i}]")
    elif isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: {type(actual)}"
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), f"{where}: dtype or shape differ"
        assert torch.equal(actual.cpu(), expected.cpu()), f"{where}: values differ"
    else:
        assert actual == expected, f"{where}: {actual!r} vs {expected!r}"


def check_learns_pendulum(name, flags, total_timesteps, num_envs, resumed, tmp_path, threshold):
    """A SAC or TD3 script on Pendulum-v1 (episodes of 200 steps) reaches a mean of `threshold` over 10 consecutive
    training episodes within `total_timesteps` (the run stops there). resumed: saved at half the budget and resumed in
    a new run, whose episodes are counted."""
    flags = ("--env-id", "Pendulum-v1", *flags)
    if resumed:
        flags = (*flags, "--save-model", "--model-path", tmp_path / "agent.pt", "--eval-episodes", "0")
        run_in_process(name, *flags, "--total-timesteps", total_timesteps // 2)
        flags = (*flags, "--resume", tmp_path / "agent.pt")
    reached = lambda returns: len(returns) >= 10 and statistics.mean(returns[-10:]) > threshold  # noqa: E731
    returns = run_in_process_until(name, *flags, "--total-timesteps", total_timesteps, reached=reached)
    played = total_timesteps // 2 if resumed else total_timesteps
    episodes = num_envs * (played // num_envs // 200)
    stopped = reached(returns)  # stopped there: its episodes so far
    assert len(returns) <= episodes if stopped else len(returns) == episodes, (
        f"Pendulum-v1 episodes last 200 steps: {episodes} in {played} steps; got {len(returns)}"
    )
    print(name, *flags, f": {len(returns)} of {episodes} episodes; returns {[round(r) for r in returns]}")
    assert len(returns) >= 10, returns
    best10 = max(statistics.mean(returns[i : i + 10]) for i in range(len(returns) - 9))
    assert best10 > threshold, f"best mean of 10 consecutive returns {best10:.1f}"


def check_resume_continues_the_run(name, flags, tmp_path, saved_checkpoints, steps, same_as_shorter_run):
    """A run of 2 x `steps` with --checkpoint-every `steps`; a run resumed from its mid-run checkpoint ends with the
    uninterrupted run's step counter and optimizer step counts, and keeps the replay rows written before the resume
    (where there is a replay buffer). same_as_shorter_run: the mid-run checkpoint is, entry for entry, what a run of
    `steps` saves at its end (true where --total-timesteps sets no schedule)."""
    common = (*flags, "--save-model", "--eval-episodes", "0")
    run_in_process(name, *common, "--total-timesteps", 2 * steps, "--checkpoint-every", steps,
                   "--model-path", tmp_path / "full.pt")  # fmt: skip
    assert len(saved_checkpoints) == 2, "one checkpoint mid-run and one at the end"
    mid, full = saved_checkpoints
    assert (mid["global_step"], full["global_step"]) == (steps, 2 * steps)
    if same_as_shorter_run:
        run_in_process(name, *common, "--total-timesteps", steps, "--model-path", tmp_path / "short.pt")
        short = saved_checkpoints[2]
        assert (short["total_timesteps"], mid["total_timesteps"]) == (steps, 2 * steps)  # each run's own budget
        assert_same_state({**short, "total_timesteps": 2 * steps, "run_seconds": mid["run_seconds"]}, mid)
    torch.save(mid, tmp_path / "mid.pt")
    run_in_process(name, *common, "--total-timesteps", 2 * steps, "--resume", tmp_path / "mid.pt",
                   "--model-path", tmp_path / "resumed.pt")  # fmt: skip
    resumed = load_checkpoint(tmp_path / "resumed.pt")
    assert resumed["global_step"] == 2 * steps
    assert optimizer_steps(resumed) == optimizer_steps(full)
    assert all(optimizer_steps(mid).values()), "no update before the checkpoint: the check would prove little"
    if "replay_buffer" in mid:
        replay, full_replay = resumed["replay_buffer"], full["replay_buffer"]
        assert (replay["pos"], replay["full"]) == (full_replay["pos"], full_replay["full"])
        for key, rows in mid["replay_buffer"].items():
            if isinstance(rows, torch.Tensor):
                assert torch.equal(replay[key][: len(rows)], rows), f"replay {key} before resume"
                assert replay[key].shape == full_replay[key].shape, key
    return resumed
