"""``ejk.testing``'s helpers for tests of traced programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ejk.testing import jaxpr_equations


def test_jaxpr_equations_walks_nested_jaxprs_in_order() -> None:
    def fn(x: jax.Array) -> jax.Array:
        y = jnp.sin(x)
        return jax.lax.cond(x.sum() > 0, lambda v: jnp.cos(v), lambda v: jnp.tanh(v), y)

    closed = jax.make_jaxpr(fn)(jnp.ones(3))
    names = [eqn.primitive.name for eqn in jaxpr_equations(closed)]
    assert names.index("sin") < names.index("cond") < names.index("cos")  # a branch after the cond that holds it
    assert {"cos", "tanh"} <= set(names)
    assert [e.primitive.name for e in jaxpr_equations(closed.jaxpr)] == names  # a Jaxpr as well as a ClosedJaxpr
