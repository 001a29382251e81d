"""TF's arithmetic, below both ``tfgrad.ops`` (the semantics and the NumPy references) and
``tfgrad.kernels`` (the compiled kernels), which both import it; it imports neither.

- ``fpenv``: TF's floating-point environment (denormals flushed: FTZ and DAZ), and
  ``mxcsr``, the register that sets it, from compiled code;
- ``eigen``: how Eigen and TF split work over TF's threads (Eigen's cost model,
  ``parallelFor`` blocks, ``ReduceOuterDimensions``) and the order of Eigen's full sum
  reduction (its tree, its shards, and the plan the kernels run it by);
- ``rsqrt``: Eigen's approximate reciprocal square root (TF's x86 build);
- ``depthwise``: depthwise convolution's geometry (TF's window arithmetic) and the rule
  for the inserted zeros of TF's explicitly dilated filter.
"""
