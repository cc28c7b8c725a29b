"""stax-rs checkpoints from JAX: the lines of the README's "Checkpoints" section, and the
commands tests/checkpoint.rs runs with them.

A checkpoint is one .npz whose members are named by JAX key paths: `params/[0][0]` for the
parameters of a stax model, `opt/[0].count`, `opt/[0].mu[0][0]`, `opt/[0].nu[0][0]` for an
optax.adam state. `save` and `load` below are all a JAX program needs (NumPy and
jax.tree_util; no stax-rs code):

    save("ckpt.npz", params, opt_state)            # np.savez with key-path names
    params, opt_state = load("ckpt.npz", params, opt_state)  # templates from a fresh init

Commands:
    python3 scripts/jax_checkpoint.py fixture OUT.npz
        the committed fixture tests/data/jax_tiny.npz: TINY's parameters from
        init_fun(PRNGKey(0)) after one Adam step on a batch, the optax state, the batch
        (batch/x, batch/y) and JAX's loss there (jax/loss) and after one more step
        (jax/loss_next)
    python3 scripts/jax_checkpoint.py apply CKPT.npz BATCH.npz
        loads a stax-rs checkpoint of TINY into JAX and prints, as JSON, its loss on the batch
        of BATCH.npz (batch/x, batch/y), and the loss after one more Adam step from its state
    python3 scripts/jax_checkpoint.py list CKPT.npz
        prints every member's name, shape and dtype as numpy.load reads them (NumPy only)
"""

import json
import sys

import numpy as np


# ---- the README's lines ----------------------------------------------------------------

def save(path, params, opt_state, **extra):
    from jax.tree_util import keystr, tree_flatten_with_path
    members = {"params/" + keystr(k): np.asarray(v) for k, v in tree_flatten_with_path(params)[0]}
    members |= {"opt/" + keystr(k): np.asarray(v) for k, v in tree_flatten_with_path(opt_state)[0]}
    np.savez(path, **members, **extra)


def load(path, params, opt_state):
    from jax.tree_util import keystr, tree_flatten_with_path, tree_structure, tree_unflatten
    z = np.load(path)
    def fill(prefix, like):
        leaves = [z[prefix + keystr(k)] for k, _ in tree_flatten_with_path(like)[0]]
        return tree_unflatten(tree_structure(like), leaves)
    return fill("params/", params), fill("opt/", opt_state)


# ---- the tests' model ------------------------------------------------------------------

INPUT = (4, 6, 6, 3)
LR = 1e-2


def tiny():
    """serial![Conv::same(4, (3, 3)), Relu, Flatten, Dense(8), Relu, Dense(2)] in stax."""
    from jax.example_libraries import stax
    return stax.serial(stax.Conv(4, (3, 3), padding="SAME"), stax.Relu, stax.Flatten,
                       stax.Dense(8), stax.Relu, stax.Dense(2))


def trainer():
    import jax
    import optax
    init, apply = tiny()
    opt = optax.adam(LR)

    def loss(params, x, y):
        return optax.softmax_cross_entropy(apply(params, x), y).mean()

    def step(params, state, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return init, opt, jax.jit(loss), jax.jit(step)


def fixture(out):
    import jax
    init, opt, loss, step = trainer()
    _, params = init(jax.random.PRNGKey(0), INPUT)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(INPUT).astype(np.float32)
    y = np.eye(2, dtype=np.float32)[rng.integers(0, 2, INPUT[0])]
    params, state, _ = step(params, opt.init(params), x, y)
    after, _, value = step(params, state, x, y)
    save(out, params, state, **{"batch/x": x, "batch/y": y, "jax/loss": np.float32(value),
                                "jax/loss_next": np.float32(loss(after, x, y))})


def apply_checkpoint(ckpt, batch):
    import jax
    init, opt, loss, step = trainer()
    _, like = init(jax.random.PRNGKey(1), INPUT)
    params, state = load(ckpt, like, opt.init(like))
    z = np.load(batch)
    x, y = z["batch/x"], z["batch/y"]
    value = loss(params, x, y)
    params, state, _ = step(params, state, x, y)
    print(json.dumps({"loss": float(value), "loss_next": float(loss(params, x, y)),
                      "count": int(state[0].count)}))


def list_members(ckpt):
    z = np.load(ckpt)
    print(json.dumps([[k, list(z[k].shape), z[k].dtype.str] for k in z.files]))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"fixture": fixture, "apply": apply_checkpoint, "list": list_members}[command](*args)
