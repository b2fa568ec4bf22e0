"""The one exception type reshard raises for bad input or impossible requests."""


class ReshardError(ValueError):
    """Something about a Fusion, a sharding, a mesh or a plan's inputs is wrong.

    The message names the op / tensor / mesh involved and what is wrong with it.
    """
