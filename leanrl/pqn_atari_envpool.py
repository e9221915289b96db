# Parallelised Q-learning (PQN) on Atari (envpool), plain eager PyTorch (the baseline of the speed-up table).
# Its twin, pqn_atari_envpool_torchcompile.py, trains the same agent faster: `diff` the two files.
# PQN (Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning") is DQN without a replay buffer and
# without a target network: many envs fill an on-policy rollout, a Q network with LayerNorm (which keeps its
# bootstrapped targets stable) regresses onto the rollout's Q(lambda) returns for a few epochs, and the rollout goes.
import os
from dataclasses import dataclass
from types import SimpleNamespace

import envpool
import numpy as np
import run_utils
import torch
import torch.nn as nn
import tyro
from envpool.registration import registry


@dataclass
class Args(run_utils.RunArgs):  # RunArgs: the flags every script has (seed, cuda, checkpoints, evaluation, ...)
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    env_id: str = "Breakout-v5"
    """the id of the environment (an envpool Atari game)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment"""
    measure_burnin: int = 3
    """training iterations (rollout + update) left out of the sps measure (compile, warm-up)"""
    checkpoint_every: int = 0
    """with --save-model, also save the checkpoint every this many env steps, as an iteration ends (0: only at end)"""
    eval_episodes: int = 10
    """games of the saved agent's epsilon-greedy policy (epsilon 0.05) on a fresh env after training"""
    capture_video: bool = False
    """with --save-model, record the evaluation games as MP4 files in a videos/ folder beside the checkpoint (84x84)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for the Q network"""
    gamma: float = 0.99
    """the discount factor gamma"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the Q network on each rollout"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    start_e: float = 1.0
    """the exploration rate epsilon (probability of a random action) at the first step"""
    end_e: float = 0.01
    """the exploration rate at the end of its decay, and from then on"""
    exploration_fraction: float = 0.10
    """the fraction of total-timesteps over which epsilon falls from start-e to end-e"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) targets (0: one-step Q-learning targets, 1: Monte Carlo returns)"""


# Each numeric hyper-parameter's domain, checked before the first step (run_utils.RUN_DOMAINS: the other flags').
DOMAINS = {
    "learning_rate": "> 0",
    "num_envs": ">= 1",
    "num_steps": ">= 1",
    "num_minibatches": ">= 1",
    "update_epochs": ">= 1",
    "gamma": "[0, 1]",
    "start_e": "[0, 1]",
    "end_e": "[0, 1]",
    "exploration_fraction": "(0, 1]",
    "max_grad_norm": "> 0",
    "q_lambda": "[0, 1]",
}
EVAL_EPSILON = 0.05  # the evaluation's exploration rate, as in CleanRL's DQN evaluation (it has none for PQN)


def check_args(args):
    run_utils.check_domains(args, DOMAINS)
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        run_utils.exit_with_error(f"--num-minibatches ({args.num_minibatches}) does not divide a batch of {batch_size}")
    if args.end_e > args.start_e:
        run_utils.exit_with_error(f"--end-e ({args.end_e}) is above --start-e ({args.start_e}): epsilon only goes down")


def make_envs(env_id, num_envs, seed):
    if env_id not in envpool.list_all_envs():
        run_utils.exit_with_error(f"cannot make env {env_id!r}: envpool has no env with this id")
    # envpool's registry names the module that implements each id: only its Atari games give 84x84 frames.
    if registry.specs[env_id][0] != "envpool.atari":
        run_utils.exit_with_error(f"PQN Atari needs an Atari game (e.g. Breakout-v5), {env_id} is not one")
    try:
        # Frames: grey 84x84, 4 stacked, 4 frames skipped per step, up to 30 no-ops at reset. Episodic life
        # (a lost life ends an episode) and rewards clipped to their sign are for learning only: the returns
        # reported are the game's own (infos["reward"], summed until infos["terminated"]: the game is over).
        envs = envpool.make(
            env_id,
            env_type="gymnasium",
            num_envs=num_envs,
            episodic_life=True,
            reward_clip=True,
            seed=seed % 2**31,  # envpool takes an int32: a seed plus an offset wraps around
        )
    except Exception as error:
        run_utils.exit_with_error(f"cannot make env {env_id!r}: {error}")
    return envs


def epsilon_at(step, args):
    """The exploration rate at a step: start_e at step 0, down in a straight line to end_e at step
    exploration_fraction * total_timesteps, then end_e."""
    decay_steps = args.exploration_fraction * args.total_timesteps
    return max(args.end_e, args.start_e + (args.end_e - args.start_e) * step / decay_steps)


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class QNetwork(nn.Module):
    """The Nature DQN CNN with a LayerNorm after each hidden layer, one Q value per action."""

    def __init__(self, num_actions):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.LayerNorm([32, 20, 20]),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.LayerNorm([64, 9, 9]),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.LayerNorm([64, 7, 7]),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.LayerNorm(512),
            nn.ReLU(),
            layer_init(nn.Linear(512, num_actions)),
        )

    def forward(self, x):
        return self.network(x / 255.0)


def epsilon_greedy(q_values, epsilon):
    """Per row, a uniformly random action with probability epsilon, else the action of the highest Q value. One
    draw of the generator serves both choices of every row, row after row."""
    uniform = torch.rand((q_values.shape[0], 2), device=q_values.device)
    random_actions = (uniform[:, 1] * q_values.shape[1]).long()
    return torch.where(uniform[:, 0] < epsilon, random_actions, q_values.argmax(1))


def compute_q_lambda_returns(rewards, values, dones, next_value, next_done, gamma, q_lambda):
    """Q(lambda) returns of a rollout, all tensors [num_steps, num_envs] but next_*: [num_envs].

    values[t] = max_a Q(obs[t], a). The return of step t mixes the one-step target on the next state's best Q value
    and the return of the next step: G[t] = r[t] + gamma * ((1 - q_lambda) * values[t + 1] + q_lambda * G[t + 1]),
    and the step after the rollout's last is next_value (so G[T - 1] = r + gamma * next_value). dones[t] says
    observation t is the last frame of a finished episode: nothing after it is bootstrapped or summed.
    """
    returns = torch.zeros_like(rewards)
    num_steps = rewards.shape[0]
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            next_non_terminal = 1.0 - next_done
            next_values = next_return = next_value
        else:
            next_non_terminal = 1.0 - dones[t + 1]
            next_values, next_return = values[t + 1], returns[t + 1]
        mixed = (1 - q_lambda) * next_values + q_lambda * next_return
        returns[t] = rewards[t] + gamma * next_non_terminal * mixed
    return returns


def masked_mean(x, mask):
    """The mean of x over the entries where mask is 1 (0 where there is none)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def build_pqn(num_actions, args, device):
    """The Q network, its optimizer and the update of one minibatch; the training loop only calls the functions."""
    qnet = QNetwork(num_actions).to(device)
    optimizer = torch.optim.RAdam(qnet.parameters(), lr=args.learning_rate)

    def update(obs, actions, returns, mask):
        """One gradient step on a minibatch; mask is 0 for envpool's reset steps (see the rollout), 1 elsewhere."""
        q_values = qnet(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
        loss = masked_mean((q_values - returns) ** 2, mask)

        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(qnet.parameters(), args.max_grad_norm)
        optimizer.step()
        return dict(td_loss=loss.detach(), q_values=masked_mean(q_values.detach(), mask))

    def policy(obs, epsilon):
        """The epsilon-greedy actions and the best Q value of each observation."""
        with torch.no_grad():
            q_values = qnet(obs)
        return epsilon_greedy(q_values, epsilon), q_values.max(1).values

    def value(obs):
        with torch.no_grad():
            return qnet(obs).max(1).values

    def set_learning_rate(lr):
        optimizer.param_groups[0]["lr"] = lr

    def state_dict():
        """The Q network's and the optimizer's state_dicts: a checkpoint's agent."""
        return {"qnet": qnet.state_dict(), "optimizer": optimizer.state_dict()}

    def load_state_dict(state):
        qnet.load_state_dict(state["qnet"])
        optimizer.load_state_dict(state["optimizer"])

    return SimpleNamespace(
        optimizer=optimizer,
        update=update,
        policy=policy,
        value=value,
        set_learning_rate=set_learning_rate,
        state_dict=state_dict,
        load_state_dict=load_state_dict,
    )


def evaluation_policy(checkpoint, env, device):
    """The saved agent's epsilon-greedy policy (epsilon 0.05), for the evaluation: a fresh Q network. Not greedy: a
    greedy agent can repeat one move forever (in Breakout, never serve the ball) until the game's time limit, and
    CleanRL's DQN evaluation uses this epsilon. The draws come from torch's generator, which the
    evaluation seeds with its own seed."""
    qnet = QNetwork(env.envs.action_space.n).to(device)
    qnet.load_state_dict(checkpoint["agent"]["qnet"])

    def act(obs):
        with torch.no_grad():
            q_values = qnet(torch.as_tensor(obs, dtype=torch.float32, device=device))
        return epsilon_greedy(q_values, EVAL_EPSILON).cpu().numpy()

    return act


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = -(-args.total_timesteps // batch_size)  # whole rollouts: at least total_timesteps steps
    make_eval_env = lambda seed, render_mode: run_utils.EvalGame(make_envs(args.env_id, 1, seed))  # noqa: E731
    schedule = "the learning-rate anneal and the epsilon decay" if args.anneal_lr else "the epsilon decay"
    run = run_utils.Run(
        args,
        script=__file__,
        algo="pqn_atari",
        name="PQN Atari",
        total_steps=num_iterations * batch_size,
        make_eval_env=make_eval_env,
        unit="games",
        schedule=schedule,
    )
    device = run.device
    start_iteration, start_step = (
        (run.checkpoint["iteration"], run.checkpoint["global_step"]) if run.checkpoint else (0, 0)
    )

    # A resumed run starts new games, on envs seeded by the step it resumes at.
    envs = make_envs(args.env_id, args.num_envs, args.seed + start_step)
    obs_shape = envs.observation_space.shape
    pqn = build_pqn(envs.action_space.n, args, device)
    if run.checkpoint:
        pqn.load_state_dict(run.checkpoint["agent"])
        run_utils.set_rng_state(run.checkpoint["rng"])

    def save_checkpoint():
        """A PQN checkpoint: the step, the iterations done (where the schedules go on) and the agent."""
        run.save_checkpoint(global_step=global_step, iteration=global_step // batch_size, agent=pqn.state_dict())

    # Rollout storage.
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)

    next_obs, _ = envs.reset()
    next_obs = torch.tensor(next_obs, dtype=torch.float32, device=device)
    next_done = torch.zeros(args.num_envs, device=device)
    game_returns = np.zeros(args.num_envs)  # each env's unclipped score since its game started, over all lives
    global_step = start_step
    measure_from = start_iteration + 1 + args.measure_burnin  # the first iteration the sps clock counts
    for iteration in range(start_iteration + 1, num_iterations + 1):
        run.clock(iteration, train_from=start_iteration + 1, measure_from=measure_from, global_step=global_step)
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            pqn.set_learning_rate(frac * args.learning_rate)

        # envpool ends an episode (a life) on one step and resets that env on the next one, which ignores its
        # action and returns the new episode's first frame with reward 0. So dones[t] = 1 marks obs[t] as the
        # last frame of an episode: the returns do not reach across it, and step t, the reset step, is no
        # transition of the game: the update masks it out.
        for step in range(args.num_steps):
            global_step += args.num_envs
            epsilon = epsilon_at(global_step, args)  # at the step count this step reaches, as in CleanRL
            obs[step] = next_obs
            dones[step] = next_done
            action, value = pqn.policy(next_obs, epsilon)
            actions[step], values[step] = action, value

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            # The game's real return: its unclipped rewards summed over all lives, until the game is over
            # (infos["terminated"]) or cut by the time limit.
            game_returns += infos["reward"]
            for index in np.flatnonzero(infos["terminated"].astype(bool) | truncations):
                run.episode(float(game_returns[index]), global_step, epsilon=epsilon)
                game_returns[index] = 0.0
            rewards[step] = torch.tensor(reward, device=device)
            next_obs = torch.tensor(next_obs, dtype=torch.float32, device=device)
            next_done = torch.tensor(terminations | truncations, dtype=torch.float32, device=device)

        # A truncation (the time limit) ends the return like a termination (a lost life), as in CleanRL and the paper.
        next_value = pqn.value(next_obs)
        returns = compute_q_lambda_returns(rewards, values, dones, next_value, next_done, args.gamma, args.q_lambda)

        # Flatten the batch.
        b_obs = obs.reshape((-1,) + obs_shape)
        b_actions = actions.reshape(-1)
        b_returns = returns.reshape(-1)
        b_mask = 1.0 - dones.reshape(-1)

        # Regress the Q values of the actions taken onto their returns, a few epochs of minibatches.
        for _ in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device)
            for start in range(0, batch_size, minibatch_size):
                mb_inds = b_inds[start : start + minibatch_size]
                losses = pqn.update(b_obs[mb_inds], b_actions[mb_inds], b_returns[mb_inds], b_mask[mb_inds])

        # Log once per iteration, from the last minibatch.
        charts = {"charts/learning_rate": pqn.optimizer.param_groups[0]["lr"], "charts/epsilon": epsilon}
        run.log(global_step, losses, charts)
        if run.checkpoint_due(global_step, batch_size):
            save_checkpoint()
        if run.stopping:
            break
    envs.close()
    run.finish(global_step, save_checkpoint, evaluation_policy)
