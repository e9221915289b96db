"""One rank of the distributed PPO Atari tests, launched by torchrun from tests/test_ppo_atari_distributed.py:

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/distributed_worker.py gradient OUT
    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/distributed_worker.py run OUT SCRIPT FLAGS...

gradient: each rank updates each script's PPO (plain, twin) on its share of a fixed global minibatch (some steps
masked out), with and without advantage normalisation; saves the parameters before, the all-reduced gradients and
the losses summed over ranks.
run: each rank runs SCRIPT's `__main__` with FLAGS and saves what it ended with (parameters, last rollout's
observations, optimizer step counts, episode returns, its envs' seeds, exit status). Each writes OUT/<mode>_rank<r>.pt.
"""

import os
import sys
from pathlib import Path

import envpool
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import built, default_dtype, load_script, script_path  # noqa: E402
from test_ppo_atari import DISTRIBUTED, DISTRIBUTED_TWIN, build, call_update, random_minibatch  # noqa: E402

GLOBAL_MINIBATCH = 16  # the rows of the global minibatch; each rank gets a contiguous half


def gradient(out):
    dist.init_process_group("gloo")
    rank, share = dist.get_rank(), GLOBAL_MINIBATCH // dist.get_world_size()
    results = {}
    # The same random minibatch on every rank, drawn as float32 and computed in float64: the twin's convolutions sum in
    # another order, which in float32 can flip a ReLU whose input is within rounding of 0.
    batch = random_minibatch(seed=7, size=GLOBAL_MINIBATCH)
    batch = {key: value.double() if value.is_floating_point() else value for key, value in batch.items()}
    rank_batch = {key: value[rank * share : (rank + 1) * share] for key, value in batch.items()}
    with default_dtype(torch.float64):
        for name in (DISTRIBUTED, DISTRIBUTED_TWIN):
            module = load_script(name)
            for norm_adv in (True, False):
                # Seeded by rank: rank 0's parameters must reach the others. No clipping: the gradient is compared.
                ppo = build(module, seed=100 + rank, norm_adv=norm_adv, max_grad_norm=1e9)
                initial = {key: value.clone() for key, value in ppo.network.state_dict().items()}
                losses = call_update(ppo, name, rank_batch)
                summed = module.sum_over_ranks(*(loss.detach() for loss in losses.values()))
                results[name, norm_adv] = dict(
                    initial=initial,
                    gradients={key: value.grad.clone() for key, value in ppo.network.named_parameters()},
                    losses=dict(zip(losses.keys(), summed, strict=True)),
                    batch=batch,
                )
    torch.save(results, Path(out) / f"gradient_rank{rank}.pt")
    dist.destroy_process_group()


def run(out, script, flags):
    env_seeds, real_make = [], envpool.make

    def make(*args, **kwargs):
        env_seeds.append(kwargs["seed"])
        return real_make(*args, **kwargs)

    envpool.make = make
    path = script_path(script)
    sys.argv = [str(path), *flags]
    # The script's globals are kept in this dict: ranks other than 0 leave through sys.exit at the end of a run.
    run_globals, status = {"__name__": "__main__", "__file__": str(path)}, 0
    try:
        exec(compile(path.read_text(), str(path), "exec"), run_globals)
    except SystemExit as exit_:
        status = exit_.code
    ppo = run_globals["ppo"]
    rollout_obs = run_globals["obs"] if "obs" in run_globals else run_globals["rollout"]["obs"]
    torch.save(
        dict(
            status=status,
            env_seeds=env_seeds,
            params={key: value.clone() for key, value in built(ppo, "agent").state_dict().items()},
            rollout_obs=rollout_obs.clone(),
            optimizer_steps=sorted({state["step"].item() for state in ppo.optimizer.state.values()}),
            episode_returns=run_globals["run"].episode_returns,
        ),
        Path(out) / f"run_rank{os.environ['RANK']}.pt",
    )


if __name__ == "__main__":
    mode, out, *rest = sys.argv[1:]
    torch.set_num_threads(1)
    if mode == "gradient":
        gradient(out)
    else:
        run(out, rest[0], rest[1:])
