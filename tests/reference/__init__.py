"""Independent numpy reference implementations, written from the op's math, not from our kernels."""
