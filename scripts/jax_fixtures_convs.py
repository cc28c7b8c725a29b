#!/usr/bin/env python3
"""JAX's numbers for the convolution, normalization and pooling layers of issue 10 and stax's
ResNet blocks (tests/jax_parity_convs.rs), as small JSON fixtures.

The format is scripts/jax_fixtures.py's (branch `layers`): for each entry below this runs the
stax layer with the local jax (f32, `jax.default_matmul_precision('highest')`, CPU) on fixed
inputs and writes `tests/fixtures/jax_convs/<name>.json` with the input, the parameters JAX's
`init_fun` drew (by JAX key path), the output, an output gradient `dy`, and the VJP (`dx` and
the parameter gradients). Once both scripts are on one branch, these entries move into
`LAYERS` of scripts/jax_fixtures.py (and the Rust ones into tests/jax_parity.rs).

    python3 scripts/jax_fixtures_convs.py             # every fixture
    python3 scripts/jax_fixtures_convs.py batch_norm  # just these

Inputs and output gradients are drawn by numpy from a seed made of the name, parameters by
JAX's `init_fun` from `PRNGKey(0)`: regenerating with the same jax gives the same files.
Dilation is not exposed by stax's `GeneralConv`; `dilated(...)` is stax's `GeneralConv` /
`GeneralConvTranspose` (same parameters, same init) with `rhs_dilation` passed to lax.
"""

import hashlib
import json
import os
import sys

import numpy as np

try:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.example_libraries import stax
except ImportError as e:  # the Rust tests read the committed fixtures
    sys.exit(f"skipped: jax is not installed ({e})")

jax.config.update("jax_platforms", "cpu")

OUT = os.environ.get("STAX_FIXTURES_OUT") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "jax_convs")

S = stax


def dilated(transpose, dimension_numbers, out_chan, filter_shape, strides, padding, dilation):
    """stax's GeneralConv (transpose=False) or GeneralConvTranspose, with rhs_dilation."""
    make = S.GeneralConvTranspose if transpose else S.GeneralConv
    init_fun, _ = make(dimension_numbers, out_chan, filter_shape, strides, padding)

    def apply_fun(params, x, **kwargs):
        w, b = params
        if transpose:
            y = lax.conv_transpose(x, w, strides, padding, rhs_dilation=dilation,
                                   dimension_numbers=dimension_numbers)
        else:
            y = lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=dilation,
                                         dimension_numbers=dimension_numbers)
        return y + b

    def dilated_init(rng, input_shape):
        _, params = init_fun(rng, input_shape)
        return apply_fun(params, jnp.zeros(input_shape, jnp.float32)).shape, params

    return dilated_init, apply_fun


def conv_block(kernel_size, filters, strides=(2, 2)):
    """examples/resnet50.py's ConvBlock."""
    ks = kernel_size
    f1, f2, f3 = filters
    main = S.serial(S.Conv(f1, (1, 1), strides), S.BatchNorm(), S.Relu,
                    S.Conv(f2, (ks, ks), padding="SAME"), S.BatchNorm(), S.Relu,
                    S.Conv(f3, (1, 1)), S.BatchNorm())
    shortcut = S.serial(S.Conv(f3, (1, 1), strides), S.BatchNorm())
    return S.serial(S.FanOut(2), S.parallel(main, shortcut), S.FanInSum, S.Relu)


def identity_block(kernel_size, filters):
    """examples/resnet50.py's IdentityBlock (its main branch built by shape_dependent)."""
    ks = kernel_size
    f1, f2 = filters

    def make_main(input_shape):
        return S.serial(S.Conv(f1, (1, 1)), S.BatchNorm(), S.Relu,
                        S.Conv(f2, (ks, ks), padding="SAME"), S.BatchNorm(), S.Relu,
                        S.Conv(input_shape[3], (1, 1)), S.BatchNorm())

    return S.serial(S.FanOut(2), S.parallel(S.shape_dependent(make_main), S.Identity),
                    S.FanInSum, S.Relu)


def resnet(blocks, widths, classes, pool):
    """examples/resnet50.py's ResNet50 with its blocks and widths as parameters, NHWC, ending
    on the logits (stax-rs's models::ResNet; ResNet50 is blocks (3, 4, 6, 3), widths (64, 128,
    256, 512), then LogSoftmax)."""
    layers = [S.Conv(widths[0], (7, 7), (2, 2), "SAME"), S.BatchNorm(), S.Relu,
              S.MaxPool((3, 3), strides=(2, 2))]
    for stage, (n, w) in enumerate(zip(blocks, widths)):
        layers.append(conv_block(3, [w, w, 4 * w], strides=(1, 1) if stage == 0 else (2, 2)))
        layers += [identity_block(3, [w, w]) for _ in range(n - 1)]
    return S.serial(*layers, S.AvgPool(pool), S.Flatten, S.Dense(classes))


# name -> (stax expression, input shape, input scale)
LAYERS = {
    "general_conv_nchw_dilated": (
        "dilated(False, ('NCHW', 'OIHW', 'NCHW'), 3, (3, 2), (2, 1), 'SAME', (2, 1))",
        [2, 2, 7, 6], 1.0),
    "conv_explicit_dilated_batch1": (
        "dilated(False, ('NHWC', 'HWIO', 'NHWC'), 3, (2, 3), (1, 2), [(2, 0), (1, 3)], (1, 2))",
        [1, 6, 7, 2], 1.0),
    "general_conv_nhwc_oihw_valid": (
        "S.GeneralConv(('NHWC', 'OIHW', 'NHWC'), 4, (2, 2), (2, 2), 'VALID')", [2, 5, 6, 3], 1.0),
    "general_conv_1d_nch": (
        "S.GeneralConv(('NCH', 'OIH', 'NCH'), 4, (3,), (2,), 'SAME')", [2, 3, 9], 1.0),
    "conv_transpose_same_stride2": (
        "S.ConvTranspose(3, (3, 3), (2, 2), 'SAME')", [2, 4, 3, 2], 1.0),
    "conv_transpose_valid_batch1": (
        "S.ConvTranspose(2, (3, 2), (2, 3), 'VALID')", [1, 3, 4, 3], 1.0),
    "conv_transpose_explicit_dilated": (
        "dilated(True, ('NHWC', 'HWIO', 'NHWC'), 2, (2, 2), (1, 2), [(1, 0), (0, 1)], (2, 1))",
        [2, 3, 3, 2], 1.0),
    "conv_transpose_nchw": (
        "S.GeneralConvTranspose(('NCHW', 'OIHW', 'NCHW'), 3, (3, 3), (2, 2), 'SAME')",
        [1, 2, 4, 5], 1.0),
    "conv1d_transpose_valid": ("S.Conv1DTranspose(3, (4,), (2,), 'VALID')", [2, 5, 2], 1.0),
    "batch_norm": ("S.BatchNorm()", [2, 3, 4, 3], 2.0),
    "batch_norm_nchw_no_center": (
        "S.BatchNorm(axis=(0, 2, 3), epsilon=1e-3, center=False)", [1, 3, 4, 5], 2.0),
    "batch_norm_dense_no_scale": ("S.BatchNorm(axis=(0,), scale=False)", [5, 4], 2.0),
    "sum_pool_valid": ("S.SumPool((2, 2))", [2, 5, 4, 3], 1.0),
    "sum_pool_same_stride2": ("S.SumPool((3, 3), (2, 2), 'SAME')", [1, 7, 6, 2], 1.0),
    "avg_pool_same_stride2": ("S.AvgPool((3, 3), (2, 2), 'SAME')", [1, 7, 6, 2], 1.0),
    "avg_pool_valid_stride2": ("S.AvgPool((2, 2), (2, 2))", [2, 5, 5, 3], 1.0),
    "resnet_conv_block": ("conv_block(3, [2, 3, 4])", [2, 5, 6, 3], 1.0),
    "resnet_identity_block": ("identity_block(3, [2, 3])", [3, 3, 3, 4], 1.0),
    "resnet_shallow": ("resnet((1, 2, 1, 1), (2, 2, 4, 4), 3, (1, 1))", [2, 16, 16, 3], 1.0),
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


def main(names):
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        sys.exit(f"unknown fixtures {unknown}; known: {sorted(LAYERS)}")
    os.makedirs(OUT, exist_ok=True)
    with jax.default_matmul_precision("highest"):
        for name in names or sorted(LAYERS):
            fixture = {"name": name, "jax": jax.__version__, **layer_fixture(name, *LAYERS[name])}
            with open(os.path.join(OUT, f"{name}.json"), "w") as f:
                json.dump(fixture, f, separators=(",", ":"))
                f.write("\n")
            print(f"wrote {name}.json")


if __name__ == "__main__":
    main(sys.argv[1:])
