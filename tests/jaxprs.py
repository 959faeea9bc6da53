"""Walk a jaxpr with its nested jaxprs (tests that look at the traced program)."""

LOOPS = ("scan", "while")


def equations(jaxpr, depth=0):
    """(eqn, loop depth) for every equation of jaxpr and of the jaxprs in its equations'
    parameters (closed ones opened; in lists and tuples too); a scan or while body is one
    loop deeper."""
    for eqn in jaxpr.eqns:
        yield eqn, depth
        inner = depth + (eqn.primitive.name in LOOPS)
        for v in eqn.params.values():
            for sub in (v if isinstance(v, (list, tuple)) else (v,)):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    yield from equations(sub, inner)


ATTENTION_WORK = ("scan", "while", "dot_general", "exp", "all_gather")


def step_work(cfg, names=ATTENTION_WORK) -> dict:
    """How many of each primitive in `names` the traced gradient step of cfg holds (the
    attention's loops, GEMMs, exponentials and gathers: what it runs, forward and backward)."""
    import jax
    from parity import batch_for
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training import state as S, step
    tx, _ = S.make_optimizer(cfg)
    params = jax.eval_shape(lambda: S.init_state(cfg, tx)["params"])
    grad_fn = step.make_grad_fn(cfg, make_mesh(cfg.parallel.mesh_dims))
    found = [eqn.primitive.name for eqn, _ in equations(
        jax.make_jaxpr(grad_fn)(params, batch_for(cfg), 0).jaxpr)]
    return {k: found.count(k) for k in names}
