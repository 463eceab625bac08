"""The fleet: the nodes sweeps run on, registered or rented (`providers/`)."""
