# What every twin adds to run_utils: optimizer states in the plain script's layout (a checkpoint loads across a pair), a
# learning rate that compiled and captured steps read, fp32 layers under --bf16, and torch.compile's settings.
import os
import sys
import warnings

import torch


def optimizer_state(optimizer, members=1, **settings):
    """An optimizer's state_dict in the plain script's layout: its settings, and an ensemble's members' own entries."""
    state = optimizer.state_dict()
    groups = [{**group, **settings} for group in state["param_groups"]]
    if members == 1:
        return {**state, "param_groups": groups}
    n = len(groups[0]["params"])
    per_member = {
        i * n + k: {name: value if name == "step" else value[i] for name, value in param_state.items()}
        for i in range(members)
        for k, param_state in state["state"].items()
    }
    groups[0]["params"] = list(range(members * n))
    return {"state": per_member, "param_groups": groups}


def load_optimizer_state(optimizer, state, members=1, **settings):
    """Load a state saved in the plain layout (see optimizer_state) into an optimizer of the twin's settings."""
    groups = [{**group, **settings} for group in state["param_groups"]]
    if members > 1:  # each member's entries stacked back into the stacked parameter's
        n = len(groups[0]["params"]) // members
        saved = state["state"]
        state = {"state": {
            k: {name: value if name == "step" else torch.stack([saved[i * n + k][name] for i in range(members)])
                for name, value in saved[k].items()}
            for k in range(n) if k in saved
        }}  # fmt: skip
        groups = [{**group, "params": list(range(n))} for group in groups]
    optimizer.load_state_dict({**state, "param_groups": groups})


class TensorLearningRate:
    """An optimizer's learning rate in the 0-d tensor its compiled and captured steps read (a changed Python float
    would recompile them), written in place; checkpoints hold the float the schedule set, as the plain script's
    optimizer does (not its float32 rounding), with the plain optimizer's settings."""

    def __init__(self, optimizer, lr):
        self.optimizer, self.lr = optimizer, lr

    def set(self, lr):
        self.optimizer.param_groups[0]["lr"].fill_(lr)
        self.lr = lr

    def optimizer_state(self, **plain_settings):
        return optimizer_state(self.optimizer, lr=self.lr, **plain_settings)

    def load_optimizer_state(self, state, **twin_settings):
        tensor = self.optimizer.param_groups[0]["lr"]
        load_optimizer_state(self.optimizer, state, lr=tensor, **twin_settings)
        self.optimizer.param_groups[0]["lr"] = tensor  # load_state_dict copies the groups: keep the tensor read
        self.set(state["param_groups"][0]["lr"])


def fp32_layer(layer, x):
    """A layer in its weights' dtype (fp32), even under --bf16's autocast, for where bf16's 8 significant bits would
    show: a last layer, whose outputs (logits, values, Q values) set a ratio, a target or a loss (a Q value near 1000
    is a multiple of 4 in bf16); a first layer of observations and actions, whose rounding biases the gradients."""
    with torch.autocast(x.device.type, enabled=False):
        return layer(x.to(layer.weight.dtype))


# Dynamo's checks on the code's structure: types, attributes, dict keys, sequence lengths, modules and their hooks.
STRUCTURE_GUARDS = {"TYPE_MATCH", "CLASS_MATCH", "HASATTR", "NOT_PRESENT_IN_GENERIC_DICT", "DICT_KEYS_MATCH",
                    "DICT_CONTAINS", "DICT_NOT_CONTAINS", "SEQUENCE_LENGTH", "BUILTIN_MATCH", "MODULE_MATCH",
                    "EMPTY_NN_MODULE_HOOKS_DICT", "DUPLICATE_INPUT"}  # fmt: skip


def value_guards(guard_entries):
    """torch.compile's guard_filter_fn for the twins: before each call of a compiled function, dynamo checks that what
    its graph was traced with still holds. Keep the checks on values (every tensor's shape, dtype and device, every
    Python number, flag or function it reads, e.g. a hyper-parameter in its closure, the global state) and skip those
    on the code's structure, which a script never changes: fewer checks a call, and a second build of a twin in the
    same process, with other hyper-parameters, still gets a graph of its own."""
    return [entry.guard_type not in STRUCTURE_GUARDS for entry in guard_entries]


def set_compile_settings():
    """The process-wide settings of a twin's --compile, for every function compiled after it in this process
    (docs/running.md): dynamo traces backward() into the compiled graph (torch >= 2.11: one kernel program for a loss
    and its gradients, no autograd at run time; an older torch says in one line that it runs backward() eagerly), and
    tensordict's warning at each compilation that a TensorDictParams' lock is not enforced in compiled code is off."""
    if hasattr(torch._dynamo.config, "trace_autograd_ops"):
        torch._dynamo.config.trace_autograd_ops = True
    elif os.environ.get("RANK", "0") == "0":  # a torchrun world says it once
        print(
            f"torch {torch.__version__} cannot trace backward() into a compiled graph: it runs eagerly", file=sys.stderr
        )
    warnings.filterwarnings("ignore", message=r"Using lock_\(\) inside a compiled graph")
