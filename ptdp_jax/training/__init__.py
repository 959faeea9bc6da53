"""One training step and what it needs: the typed TrainState and its layout (state,
state_memory), the gradient paths' contract (grads), the p = 1 path (local_grads), ZeRO (zero),
the step (step), the forward-only evaluation (evaluate), the memory estimate and pre-flight
(memory, preflight), metrics and the compilation cache. May import config/, parallel/, models/,
pipeline/, data/."""
