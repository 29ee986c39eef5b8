"""Small ops that several tests and benchmarks build: the README's ``Double``."""


def double_spec(kernel="twice", name="Double"):
    """The README's ``Double`` op as :class:`ptnative.NativeOp` keyword arguments: ``y = 2 * x`` for a contiguous
    float vector ``x``, ``y`` of ``x``'s length.  ``kernel`` names the kernel function and ``name`` the op; other
    names give a library of its own (another cache key, another library loaded in the process)."""
    return dict(
        in_info=({"name": "x", "ndim": 1, "shape": (None,), "need_contiguous": True},),
        out_info=({"name": "y", "ndim": 1, "shape": ((0, 0),)},),
        c_extra_support_code=f"""
        DEF_KERNEL void {kernel}(const Float* x, Float* y, int64_t n) {{
          for (int64_t i = threadIdx.x + blockDim.x * blockIdx.x; i < n; i += blockDim.x * gridDim.x)
            y[i] = 2 * x[i];
        }}""",
        c_fw_code=f"start_dev_kernel({kernel}, (Ndarray_DEV_DATA(inputs[0]), Ndarray_DEV_DATA(*outputs[0]), "
                  "Ndarray_DIMS(inputs[0])[0]));",
        name=name,
    )
