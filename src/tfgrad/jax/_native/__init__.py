"""TF 2.21's semantics in jax.numpy / jax.lax, for every JAX backend: one module per op
family, one function per op named as the TF op (see each module's BOUNDS for how far it
is from TF's CPU kernels)."""
