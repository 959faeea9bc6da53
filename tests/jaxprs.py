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
