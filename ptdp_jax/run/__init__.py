"""A run: the training loop (loop), the config resolved for the devices at hand (resolve), the
data feed, the run log, evaluation of a checkpoint, generation and `ptdp_jax.load`
(inference). May import plan/, checkpoint/ and below."""
