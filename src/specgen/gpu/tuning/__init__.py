"""The linear kernel's configurations by shape (the packaged table and this machine's tuned one)
and `specgen tune-kernels`."""
