"""What --bf16 does to the gradients of a trained agent: SAC's or TD3's twin, from a checkpoint of a run (its agent and
replay buffer), on batches drawn from that buffer, the bf16 update's gradients against fp32's.

    python benchmarks/bf16_gradients.py CHECKPOINT [--batches 32] > FILE.md

A checkpoint is what a run writes with --checkpoint-every (or --save-model) into --checkpoint-path, of either script
of the pair. Per network (the critic: both Q networks' parameters, from the critic update; the actor, from the actor
update), over the batches, each with the same noise in both precisions:
- cosine: of bf16's gradient with fp32's on the same batch (median, min, max);
- bias: the norm of bf16's error (bf16 minus fp32) averaged over the batches, over the norm of fp32's mean gradient;
- consistency: that mean error's norm over the mean of the errors' norms: about 1/sqrt(batches) for an error that
  averages out over the updates, near 1 for one that points the same way batch after batch;
- another batch: the cosine of fp32's gradients on two different batches, how far a batch's own noise moves them.
Both updates run eagerly on the CPU from the checkpoint's weights and optimizer state, reloaded before each one.
bf16 computes the same numbers whether the CPU has bf16 units or emulates them (only slower): this runs anywhere.
Exit status 1 when fp32's gradient of one batch, computed twice, differs (the comparison would mean nothing).
"""

import argparse
import inspect
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from common import ROOT, describe_machine, fail, load_script, machine_text, table_row  # benchmarks/ is on the path

TWINS = {"sac": "sac_continuous_action_torchcompile", "td3": "td3_continuous_action_torchcompile"}


def reached(function, name):
    """A variable of the twin's build function that an update function it returns reaches (its namespace hands out the
    updates, not the networks): in the update's closure or its closure's functions', the first found."""
    functions, seen = [function], set()
    while functions:
        function = inspect.unwrap(functions.pop(0))
        if not inspect.isfunction(function) or function in seen:
            continue
        seen.add(function)
        cells = dict(zip(function.__code__.co_freevars, function.__closure__ or (), strict=True))
        if name in cells:
            return cells[name].cell_contents
        functions += [cell.cell_contents for cell in cells.values()]
    raise AttributeError(f"{name!r} is not reached from the update")


def gradients(agent, state, batches, network):
    """Per batch, the gradient of one update from the checkpoint's state, flattened: the critic's or the actor's."""
    rows = []
    for seed, batch in enumerate(batches):
        agent.load_state_dict(state)  # the same weights and optimizer state for every update
        torch.manual_seed(seed)  # the same noise (SAC's sampled actions, TD3's target smoothing) in both precisions
        if network == "critic":
            agent.update_critic(batch)
            params = reached(agent.update_critic, "qnet_params").values(True, True)
        else:
            agent.update_actor(batch)
            params = reached(agent.update_actor, "actor").parameters()
        rows.append(torch.cat([param.grad.flatten() for param in params]))
    return torch.stack(rows)


def commit():
    """This checkout's commit, + where leanrl/ has changes not committed: which code's twin was measured."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    changed = subprocess.run([*git, "status", "--porcelain", "leanrl"], capture_output=True, text=True).stdout.strip()
    return (head or "an unknown commit") + (" + changes" if changed else "")


def cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--batches", type=int, default=32, help="batches drawn from the replay buffer (default 32)")
    args = parser.parse_args()
    if args.batches < 2:
        fail(f"--batches must be 2 or more, not {args.batches}")
    try:
        checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError) as error:
        fail(f"cannot read {args.checkpoint}: {error}")
    algo = checkpoint.get("algo") if isinstance(checkpoint, dict) else None
    if algo not in TWINS or "replay_buffer" not in checkpoint:
        fail(f"{args.checkpoint} is not a checkpoint of SAC or TD3 with its replay buffer (algo: {algo})")

    torch.set_num_threads(1)
    module = load_script(TWINS[algo])
    env = module.make_env(checkpoint["env_id"])
    space, buffer_state = env.action_space, checkpoint["replay_buffer"]
    obs_dim, action_dim = buffer_state["observations"].shape[1], buffer_state["actions"].shape[1]
    cpu = torch.device("cpu")
    build = module.build_td3 if algo == "td3" else module.build_sac
    hyperparameters, low, high = checkpoint["hyperparameters"], space.low, space.high
    fp32_agent, bf16_agent = (
        build(obs_dim, action_dim, low, high, module.Args(**hyperparameters, bf16=bf16), cpu) for bf16 in (False, True)
    )
    buffer = module.ReplayBuffer(len(buffer_state["rewards"]), obs_dim, action_dim, cpu)
    buffer.load_state_dict(buffer_state)
    torch.manual_seed(0)
    size = hyperparameters["batch_size"]
    batches = [(buffer.sample(size), buffer.sample(size)) for _ in range(args.batches)]  # and another batch each

    rows = []
    first, second = zip(*batches, strict=True)
    for network in ("critic", "actor"):
        fp32 = gradients(fp32_agent, checkpoint["agent"], first, network)
        if not torch.equal(gradients(fp32_agent, checkpoint["agent"], first[:1], network)[0], fp32[0]):
            print(f"bf16_gradients.py: fp32's {network} gradient of a batch differs between two calls", file=sys.stderr)
            return 1
        errors = gradients(bf16_agent, checkpoint["agent"], first, network) - fp32
        other = gradients(fp32_agent, checkpoint["agent"], second, network)
        cosines = [cosine(error + reference, reference) for error, reference in zip(errors, fp32, strict=True)]
        other_cosines = [cosine(a, b) for a, b in zip(other, fp32, strict=True)]
        mean_error = errors.mean(0).norm()
        bias, consistency = float(mean_error / fp32.mean(0).norm()), float(mean_error / errors.norm(dim=1).mean())
        cells = f"{statistics.median(cosines):.4f} [{min(cosines):.4f}, {max(cosines):.4f}]", f"{bias:.3f}"
        rows.append(table_row(network, *cells, f"{consistency:.2f}", f"{statistics.median(other_cosines):.3f}"))
    text = "\n".join([
        f"## --bf16 against fp32: the gradients of {algo.upper()}'s twin at step {checkpoint['global_step']:,}",
        "",
        f"Checkpoint: `{args.checkpoint}` ({checkpoint['env_id']}, seed {checkpoint['seed']}); {args.batches} batches "
        f"of its replay buffer; the twin of leanrl/ at {commit()}; {machine_text(describe_machine())}, torch "
        f"{torch.__version__}; both updates eager.",
        f"Consistency of an error that averages out over the batches: about {args.batches ** -0.5:.2f}.",
        "",
        "| network | cosine, bf16 against fp32 (median [min, max]) | bias (of the mean gradient) | consistency "
        "| cosine, fp32 on another batch |",
        "|---|---|---|---|---|",
        *rows,
    ])  # fmt: skip
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
