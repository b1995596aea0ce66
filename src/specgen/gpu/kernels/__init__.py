"""specgen's Triton kernels, each with its torch reference (reference.py, or core/sampling/):
the step's (linear, attention, norm, step_io), the round's (warp, verify, noise, commit) and
dependent launch."""
