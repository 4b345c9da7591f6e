"""Generates the StableHLO test programs of handoff-xla from JAX.

Run with jax 0.11.2 (Python >= 3.12), from this directory:

    python3.12 -m venv /tmp/venv-jax && /tmp/venv-jax/bin/pip install jax==0.11.2 flatbuffers
    /tmp/venv-jax/bin/python export.py

The generated `.mlir` (text), `.mlirbc` (bytecode) and `.jaxexport` files (`Exported.serialize()`,
read by handoff_xla::Artifact) are committed, so builds and CI need no JAX. The Rust tests compute
the expected values themselves, but for JAX's gradients of the VJP artifacts (vjp_reference.rs).
"""

import jax
import jax.numpy as jnp
from jax import export

jax.config.update("jax_platforms", "cpu")


def gelu(x):
    # tanh approximation, as jax.nn.gelu(approximate=True); the Rust tests use the same formula
    return jax.nn.gelu(x, approximate=True)


def gelu_scale(x):
    return gelu(x) * 1.1 + 0.5


def tanh_matmuls(a, b):
    # an intermediate XLA keeps in scratch memory between the two matmuls
    return jnp.tanh(a @ b) @ b.T + 1.0


def row_sum(x):
    return jnp.sum(x, axis=1)


def matmul(a, b):
    return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)


def sum_and_max(x):
    return jnp.sum(x), jnp.max(x), x * 2.0


def layernorm_gelu(x, gamma, beta):
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean((xf - mean) ** 2, axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + 1e-5) * gamma.astype(jnp.float32) + beta.astype(jnp.float32)
    return gelu(y).astype(x.dtype)


def ln_gelu(h):
    # The kernel of examples/pipeline.rs and bench/python_pipeline.py: layer norm with no
    # affine (eps 1e-5) then tanh-gelu, computed in f32 and cast back to h's dtype.
    hf = h.astype(jnp.float32)
    mean = jnp.mean(hf, axis=-1, keepdims=True)
    var = jnp.mean((hf - mean) ** 2, axis=-1, keepdims=True)
    return gelu((hf - mean) * jax.lax.rsqrt(var + 1e-5)).astype(h.dtype)


def residual(x, w):
    # Two inputs, two outputs: a matmul, then the pipeline's kernel on a residual branch.
    h = jnp.matmul(x, w, precision=jax.lax.Precision.HIGHEST)
    return x + ln_gelu(h), h


def unused_arg(unused, x):
    # Ignores its first input, so jax.export drops it from the module (module_kept_var_idx = (1,)).
    return x * 2.0


def spec(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def write_text(name, f, *args):
    text = jax.jit(f).lower(*args).as_text()
    with open(f"{name}.mlir", "w") as out:
        out.write(text)
    print(f"{name}.mlir: {len(text)} bytes")


def write_exported(name, f, platforms, *args):
    exp = export.export(jax.jit(f), platforms=platforms)(*args)
    data = exp.serialize()
    with open(f"{name}.jaxexport", "wb") as out:
        out.write(data)
    print(f"{name}.jaxexport: {len(data)} bytes")


def main():
    write_text("gelu_scale_f32_1024", gelu_scale, spec((1024,)))
    write_text("gelu_scale_f32_4x8", gelu_scale, spec((4, 8)))
    write_text("row_sum_f32_8x16", row_sum, spec((8, 16)))
    write_text("matmul_f32_16x32x8", matmul, spec((16, 32)), spec((32, 8)))
    write_text("tanh_matmuls_f32_512", tanh_matmuls, spec((512, 512)), spec((512, 512)))
    write_text("sum_and_max_f32_64", sum_and_max, spec((64,)))
    for n, d in [(64, 64), (256, 256), (1024, 1024)]:
        for dt, tag in [(jnp.float32, "f32"), (jnp.bfloat16, "bf16")]:
            write_text(f"layernorm_gelu_{tag}_{n}x{d}", layernorm_gelu, spec((n, d), dt), spec((d,), dt), spec((d,), dt))
    # The pipeline's kernel (examples/pipeline.rs, examples/benches/pipeline_gpu.rs):
    # small f32 sizes for the CPU demo, bf16 up to 4096x4096 for the GPU benchmark.
    for n, dt, tag in [(64, jnp.float32, "f32"), (256, jnp.float32, "f32"), (1024, jnp.float32, "f32"),
                       (256, jnp.bfloat16, "bf16"), (1024, jnp.bfloat16, "bf16"), (4096, jnp.bfloat16, "bf16"),
                       (4096, jnp.float32, "f32")]:
        write_text(f"ln_gelu_{tag}_{n}x{n}", ln_gelu, spec((n, n), dt))
    # A large elementwise program to keep a device busy (GPU no-host-sync tests).
    write_text("gelu_scale_f32_16m", gelu_scale, spec((16 * 1024 * 1024,)))
    # The bytecode path: a portable StableHLO artifact (VHLO bytecode) from jax.export.
    # One file per platform: a multi-platform export adds a platform-index argument.
    for platform in ["cpu", "cuda"]:
        exp = export.export(jax.jit(gelu_scale), platforms=[platform])(spec((4, 8)))
        code = exp.mlir_module_serialized
        with open(f"gelu_scale_f32_4x8_{platform}.mlirbc", "wb") as out:
            out.write(code)
        print(f"gelu_scale_f32_4x8_{platform}.mlirbc: {len(code)} bytes")
    # Whole jax.export artifacts (what JAX users ship): the module with its calling
    # convention (platforms, avals, kept inputs). Exported for several platforms, the
    # module takes the platform index as its first argument.
    write_exported("ln_gelu_f32_8x16_cpu", ln_gelu, ("cpu",), spec((8, 16)))
    write_exported("ln_gelu_f32_8x16_cpu_cuda", ln_gelu, ("cpu", "cuda"), spec((8, 16)))
    write_exported("residual_f32_8x16_cpu_cuda", residual, ("cpu", "cuda"), spec((8, 16)), spec((16, 16)))
    write_exported("unused_arg_f32_cpu", unused_arg, ("cpu",), spec((4,)), spec((8,)))
    # Shape-polymorphic (a symbolic batch dimension): handoff_xla::Artifact refuses it.
    write_exported("poly_f32_cpu", ln_gelu, ("cpu",), spec(export.symbolic_shape("b, 16")))


if __name__ == "__main__":
    main()


# Gradients: `Exported.serialize(vjp_order=1)` embeds the VJP as a nested `Exported`
# (`Exported.vjp()`), read by handoff_xla::Artifact::vjp and called with Kernel::vjp. Its
# inputs are the primal inputs then one cotangent per output (float0, which the module
# drops, for integer outputs); its outputs one cotangent per primal input (float0, an i1
# array of zeros in the module, for integer inputs). Exported for the same platforms as
# the primal: a multi-platform VJP takes its own platform index first.
#
# This part is appended after `main()` on purpose: jax.export records this script's line
# numbers in each module's debug locations, so appending keeps the artifacts above
# byte-identical when the whole script is run again.

import numpy as np  # noqa: E402


def block(x, w):
    # The kernel of examples/train_step.rs: the pipeline's step x + gelu_tanh(layernorm(x @ w)).
    return x + ln_gelu(jnp.matmul(x, w, precision=jax.lax.Precision.HIGHEST))


def int_scale(x, n):
    # An integer input and an integer output: the VJP gives a float0 cotangent for n and
    # takes none (float0) for n + 1.
    return jnp.sin(x) * n.astype(jnp.float32), n + 1


def linear(x, w):
    # Linear: its VJP reads only the cotangent (module_kept_var_idx (2,)); the primals are
    # checked but not passed.
    return x * 3.0 + jnp.sum(w)


def hashed(n, seed, scale=1.0):
    # The inputs of the Rust tests' `input(n, seed)`: values in [-2, 2) from a multiplicative hash.
    i = np.arange(n, dtype=np.uint64)
    h = ((i * 2654435761 + seed) % 2**32) >> 8
    return ((h % 1000).astype(np.float32) / np.float32(250.0) - np.float32(2.0)) * np.float32(scale)


def write_vjp(name, f, platforms, *args):
    exp = export.export(jax.jit(f), platforms=platforms)(*args)
    data = exp.serialize(vjp_order=1)
    with open(f"{name}.jaxexport", "wb") as out:
        out.write(data)
    vjp = export.deserialize(data).vjp()
    print(f"{name}.jaxexport: {len(data)} bytes, VJP {vjp.in_avals} -> {vjp.out_avals}, "
          f"kept {vjp.module_kept_var_idx}")


def rust_array(name, values, doc):
    values = np.asarray(values)
    if values.dtype == np.float32:
        ty, text = "f32", [str(v) if "." in str(v) or "e" in str(v) else f"{v}.0" for v in values.reshape(-1)]
    else:
        ty, text = "i32", [str(int(v)) for v in values.reshape(-1)]
    rows = [", ".join(text[i:i + 8]) for i in range(0, len(text), 8)]
    body = "".join(f"    {r},\n" for r in rows)
    return f"/// {doc}\npub const {name}: [{ty}; {len(text)}] = [\n{body}];\n"


def main_gradients():
    for platforms, tag in [(("cpu",), "cpu"), (("cpu", "cuda"), "cpu_cuda")]:
        write_vjp(f"block_f32_8x16_{tag}_vjp", block, platforms, spec((8, 16)), spec((16, 16)))
    write_vjp("int_scale_cpu_vjp", int_scale, ("cpu",), spec((4,)), spec((4,), jnp.int32))
    write_vjp("linear_f32_cpu_vjp", linear, ("cpu",), spec((4,)), spec((2,)))

    # JAX's own values, for the Rust tests: jax.vjp of the same functions on fixed inputs,
    # checked here against the exported VJP called through JAX.
    x, w, ct = hashed(128, 2).reshape(8, 16), hashed(256, 4, 0.25).reshape(16, 16), hashed(128, 9).reshape(8, 16)
    y, pullback = jax.vjp(block, x, w)
    dx, dw = pullback(ct)
    exp = export.deserialize(open("block_f32_8x16_cpu_vjp.jaxexport", "rb").read())
    for got, want in zip(exp.vjp().call(x, w, ct), (dx, dw)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    xi, n, cti = hashed(4, 5), np.array([3, -1, 0, 7], np.int32), hashed(4, 6)
    (yi, _), pullback = jax.vjp(int_scale, xi, n)
    dxi, dn = pullback((cti, np.zeros(4, jax.dtypes.float0)))
    assert dn.dtype == jax.dtypes.float0
    parts = [
        "// Generated by adapters/xla/programs/export.py (jax 0.11.2): the inputs and JAX's values\n"
        "// (`jax.vjp`) for the VJP artifacts' tests. Included with `include!`; do not edit.\n",
        rust_array("BLOCK_X", x, "`x` of `block(x, w)` (f32[8, 16]): `input(128, 2)`."),
        rust_array("BLOCK_W", w, "`w` (f32[16, 16]): `input(256, 4) / 4`."),
        rust_array("BLOCK_CT", ct, "The cotangent of the output (f32[8, 16]): `input(128, 9)`."),
        rust_array("BLOCK_Y", y, "`block(x, w)`."),
        rust_array("BLOCK_DX", dx, "The cotangent of `x`."),
        rust_array("BLOCK_DW", dw, "The cotangent of `w`."),
        rust_array("INT_SCALE_X", xi, "`x` of `int_scale(x, n)` (f32[4]): `input(4, 5)`."),
        rust_array("INT_SCALE_N", n, "`n` (i32[4])."),
        rust_array("INT_SCALE_CT", cti, "The cotangent of the first output (f32[4]): `input(4, 6)`."),
        rust_array("INT_SCALE_Y", yi, "The first output, `sin(x) * n`."),
        rust_array("INT_SCALE_DX", dxi, "The cotangent of `x` (that of `n` is float0)."),
    ]
    with open("vjp_reference.rs", "w") as out:
        out.write("\n".join(parts))
    print("vjp_reference.rs written")


if __name__ == "__main__":
    main_gradients()
