#!/usr/bin/env python3
"""JAX's numbers for the parity tests (tests/jax_parity.rs), written as small JSON fixtures.

For every entry below this runs the layer with the local jax (f32,
`jax.default_matmul_precision('highest')`, CPU) on fixed inputs and writes
`tests/fixtures/jax/<name>.json`: the input, the parameters JAX's `init_fun` drew, the output,
an output gradient `dy`, and the VJP (`dx` and the parameter gradients). The Rust test loads
the parameters into our layer of the same name, runs our forward and backward passes and
compares (CPU always, the GPU where there is one).

    python3 scripts/jax_fixtures.py            # every fixture
    python3 scripts/jax_fixtures.py gelu relu  # just these

Adding a layer: one entry in `LAYERS` here (a name, the stax layer, an input shape, optionally
an input scale) and the same name with our layer in `LAYERS` of tests/jax_parity.rs; run the
script for that name and commit the JSON. The test fails for a fixture without a Rust entry
and for an entry without a fixture. Inputs and output gradients are drawn by numpy from a
seed made of the name, parameters by JAX's `init_fun` from `PRNGKey(0)`, so regenerating a
fixture with the same jax gives the same file.

Fixture format (JSON):
    {"name", "layer" (the stax expression), "jax" (version), "kind": "layer" | "dropout" | "loss",
     "input": tensor, "params": [tensor with "path"], "output": [tensor with "path"],
     "dy": [...], "dx": [...], "grads": [...]}
where a tensor is {"path": JAX key path (`jax.tree_util.keystr`, "" for a bare array),
"shape": [..], "data": [row-major f32 values]}. Dropout fixtures add "rate" and "key" (a u64,
as a string) and use our mask (`ops::dropout_bits`, SplitMix64, mirrored below), since JAX's
Bernoulli bits are threefry's. Loss fixtures hold "logits", "labels" (a tensor of integer
class indices, or of one-hot rows for the one-hot loss), "loss" and "dlogits".
"""

import hashlib
import json
import os
import sys

import numpy as np

try:
    import jax
    import jax.numpy as jnp
    import optax
    from jax.example_libraries import stax
except ImportError as e:  # the Rust tests read the committed fixtures; regenerating needs jax
    sys.exit(f"skipped: jax is not installed ({e})")

jax.config.update("jax_platforms", "cpu")

# STAX_FIXTURES_OUT redirects the output (tests/jax_parity.rs regenerates into a temporary
# directory to check that the committed fixtures are the script's).
OUT = os.environ.get("STAX_FIXTURES_OUT") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "jax")

S = stax
same = "SAME"


def residual():
    main = S.serial(S.Conv(3, (3, 3), padding=same), S.Relu, S.Conv(3, (3, 3), padding=same))
    return S.serial(S.FanOut(2), S.parallel(main, S.Identity), S.FanInSum, S.Relu)


# name -> (stax expression as text, input shape, input scale). The expression is evaluated
# with `S` = jax.example_libraries.stax, so the fixture records exactly what was run.
LAYERS = {
    # the layers that existed before issue 10
    "conv_same": ("S.Conv(4, (3, 3), padding='SAME')", [2, 6, 5, 3], 1.0),
    "conv_valid_stride2": ("S.Conv(3, (3, 2), (2, 2), 'VALID')", [2, 7, 5, 2], 1.0),
    "conv_same_asymmetric_batch1": ("S.Conv(2, (3, 3), (2, 1), 'SAME')", [1, 8, 6, 3], 1.0),
    "conv_1x1": ("S.Conv(5, (1, 1))", [3, 4, 4, 2], 1.0),
    "dense_rank2": ("S.Dense(5)", [3, 7], 1.0),
    "dense_rank3": ("S.Dense(2)", [2, 3, 4], 1.0),
    "flatten": ("S.Flatten", [2, 3, 3, 2], 1.0),
    "identity": ("S.Identity", [2, 3], 1.0),
    "relu": ("S.Relu", [2, 3, 3, 2], 1.0),
    "tanh": ("S.Tanh", [2, 3, 3, 2], 2.0),
    "max_pool_valid": ("S.MaxPool((2, 2))", [2, 5, 4, 3], 1.0),
    "max_pool_same_stride2": ("S.MaxPool((3, 3), (2, 2), 'SAME')", [1, 7, 6, 2], 1.0),
    "fan_out": ("S.FanOut(2)", [2, 3], 1.0),
    "fan_out_sum": ("S.serial(S.FanOut(3), S.FanInSum)", [2, 4], 1.0),
    "residual_block": ("residual()", [2, 5, 5, 3], 1.0),
    "concat_of_two_convs": (
        "S.serial(S.FanOut(2), S.parallel(S.Conv(3, (3, 3), padding='SAME'), S.Conv(2, (1, 1))),"
        " S.FanInConcat(-1))",
        [2, 5, 5, 2],
        1.0,
    ),
    "concat_axis1": (
        "S.serial(S.FanOut(2), S.parallel(S.Identity, S.Tanh), S.FanInConcat(1))",
        [2, 3, 4],
        1.0,
    ),
    "small_cnn": (
        "S.serial(S.Conv(3, (3, 3), padding='SAME'), S.Relu, S.Conv(2, (3, 3), (2, 2)), S.Relu,"
        " S.Flatten, S.Dense(4), S.Relu, S.Dense(2))",
        [2, 7, 7, 2],
        1.0,
    ),
    # issue 10: the elementwise layers
    "exp": ("S.Exp", [2, 3, 5], 2.0),
    "softplus": ("S.Softplus", [2, 3, 5], 4.0),
    "sigmoid": ("S.Sigmoid", [2, 3, 5], 4.0),
    "elu": ("S.Elu", [2, 3, 5], 3.0),
    "elu_alpha_0_5": ("S.elementwise(jax.nn.elu, alpha=0.5)", [1, 9], 3.0),
    "leaky_relu": ("S.LeakyRelu", [2, 3, 5], 2.0),
    "leaky_relu_slope_0_3": ("S.elementwise(jax.nn.leaky_relu, negative_slope=0.3)", [1, 9], 2.0),
    "selu": ("S.Selu", [2, 3, 5], 3.0),
    "gelu": ("S.Gelu", [2, 3, 5], 3.0),
    "log_softmax": ("S.LogSoftmax", [3, 5], 3.0),
    "softmax": ("S.Softmax", [1, 7], 3.0),
    "softmax_axis1": ("S.elementwise(jax.nn.softmax, axis=1)", [2, 3, 4], 2.0),
    "log_softmax_axis0": ("S.elementwise(jax.nn.log_softmax, axis=0)", [3, 2, 5], 2.0),
    "shape_dependent_dense": ("S.shape_dependent(lambda s: S.Dense(s[-1]))", [2, 3, 4], 1.0),
    "mnist_classifier_small": (
        "S.serial(S.Dense(8), S.Relu, S.Dense(8), S.Relu, S.Dense(3), S.LogSoftmax)",
        [4, 6],
        1.0,
    ),
}

# name -> (input shape, keep rate, key)
DROPOUT = {
    "dropout_0_8": ([2, 5, 3], 0.8, 0x0123_4567_89AB_CDEF),
    "dropout_0_5_batch1": ([1, 37], 0.5, 42),
}

# name -> (optax / stax expression, rows, classes, integer labels?)
LOSSES = {
    "loss_softmax_xent_integer_labels": (
        "optax.softmax_cross_entropy_with_integer_labels(z, y).mean()", 5, 3, True),
    "loss_nll": ("-jnp.mean(jnp.sum(z * jax.nn.one_hot(y, z.shape[-1]), axis=1))", 4, 6, True),
    "loss_softmax_xent_one_hot": ("optax.softmax_cross_entropy(z, y).mean()", 3, 4, False),
}


def rng_for(name):
    return np.random.RandomState(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))


def tensor(x, path=""):
    x = np.asarray(x, dtype=np.float32)
    # the shortest decimal that reads back as the same f32
    return {"path": path, "shape": list(x.shape), "data": [float(str(v)) for v in x.reshape(-1)]}


def leaves(tree):
    pairs = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [tensor(v, jax.tree_util.keystr(p)) for p, v in pairs]


def random_like(rng, tree, scale=1.0):
    return jax.tree_util.tree_map(
        lambda a: jnp.asarray(rng.uniform(-scale, scale, np.shape(a)), jnp.float32), tree)


def layer_fixture(name, expr, shape, scale):
    init_fun, apply_fun = eval(expr)
    rng = rng_for(name)
    x = jnp.asarray(rng.uniform(-scale, scale, shape), jnp.float32)
    _, params = init_fun(jax.random.PRNGKey(0), tuple(shape))
    y, vjp_fun = jax.vjp(lambda p, v: apply_fun(p, v), params, x)
    dy = random_like(rng, y)
    grads, dx = vjp_fun(dy)
    return {
        "kind": "layer", "layer": expr, "input": tensor(x), "params": leaves(params),
        "output": leaves(y), "dy": leaves(dy), "dx": leaves(dx), "grads": leaves(grads),
    }


def dropout_bits(key, n):
    """`ops::dropout_bits`: the high half of SplitMix64's output index + 1 from seed `key`."""
    with np.errstate(over="ignore"):
        z = np.uint64(key) + (np.arange(n, dtype=np.uint64) + np.uint64(1)) * np.uint64(
            0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return (z ^ (z >> np.uint64(31))) >> np.uint64(32)


def dropout_fixture(name, shape, rate, key):
    rng = rng_for(name)
    x = jnp.asarray(rng.uniform(-1, 1, shape), jnp.float32)
    threshold = int(np.float64(np.float32(rate)) * 2.0**32)
    keep = jnp.asarray((dropout_bits(key, x.size) < threshold).reshape(shape))
    # stax's Dropout in mode 'train' with our Bernoulli draw in place of `random.bernoulli`
    y, vjp_fun = jax.vjp(lambda v: jnp.where(keep, v / rate, 0), x)
    dy = random_like(rng, y)
    (dx,) = vjp_fun(dy)
    return {
        "kind": "dropout", "layer": f"S.Dropout({rate}) with the keep mask of key {key}",
        "rate": rate, "key": str(key), "input": tensor(x), "params": [],
        "output": leaves(y), "dy": leaves(dy), "dx": leaves(dx), "grads": [],
    }


def loss_fixture(name, expr, rows, classes, integer):
    rng = rng_for(name)
    z = jnp.asarray(rng.uniform(-3, 3, (rows, classes)), jnp.float32)
    labels = rng.randint(0, classes, rows)
    y = jnp.asarray(labels, jnp.int32) if integer else jax.nn.one_hot(labels, classes)
    loss, dz = jax.value_and_grad(lambda z: eval(expr, globals(), {"z": z, "y": y}))(z)
    labels_t = {"path": "", "shape": [rows], "data": [int(v) for v in labels]} if integer \
        else tensor(y)
    return {
        "kind": "loss", "layer": expr, "logits": tensor(z), "labels": labels_t,
        "loss": float(loss), "dlogits": tensor(dz),
    }


def main(names):
    every = {**{k: ("layer", v) for k, v in LAYERS.items()},
             **{k: ("dropout", v) for k, v in DROPOUT.items()},
             **{k: ("loss", v) for k, v in LOSSES.items()}}
    unknown = [n for n in names if n not in every]
    if unknown:
        sys.exit(f"unknown fixtures {unknown}; known: {sorted(every)}")
    os.makedirs(OUT, exist_ok=True)
    make = {"layer": layer_fixture, "dropout": dropout_fixture, "loss": loss_fixture}
    with jax.default_matmul_precision("highest"):
        for name in names or sorted(every):
            kind, args = every[name]
            fixture = {"name": name, "jax": jax.__version__, **make[kind](name, *args)}
            with open(os.path.join(OUT, f"{name}.json"), "w") as f:
                json.dump(fixture, f, separators=(",", ":"))
                f.write("\n")
            print(f"wrote {name}.json")


if __name__ == "__main__":
    main(sys.argv[1:])
