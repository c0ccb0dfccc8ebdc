"""Engine adapters and tensor backends. Nothing here imports from `gateway`."""
