"""Fused Numba kernels, one module per op family (batch norm: three), compiled as
``tfgrad._compile`` says (cached, never fastmath; ``Twins`` where threaded). Compiled
functions only: ``tfgrad.dispatch`` prepares their arguments and launches them. They trust
their arguments: every index they use is checked in ``tfgrad.ops`` before they are called."""
