"""Generates the StableHLO test programs of handoff-xla from JAX.

Run with jax 0.11.2 (Python >= 3.12), from this directory:

    python3.12 -m venv /tmp/venv-jax && /tmp/venv-jax/bin/pip install jax==0.11.2
    /tmp/venv-jax/bin/python export.py

The generated `.mlir` files (text), `.mlirbc` files (bytecode) and `.jaxexport` files
(whole `jax.export` artifacts, `Exported.serialize()`, read by handoff_xla::Artifact) are
committed, so builds and CI need no JAX. The Rust tests compute the expected values themselves.
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
