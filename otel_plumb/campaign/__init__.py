"""Metamorphic campaigns (SPEC section 8): perturb an agent's inputs in meaning-preserving
ways, run it, collect its trajectories, check them, and measure whether behaviour holds."""
