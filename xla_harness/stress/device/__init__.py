"""The harness's own functions on the device, outside the user's step: the finiteness checks and the
per-step commit, a block's rows, the bitwise repeat check, state copies, planted faults, the float64
reference, leaf names."""
