"""The HTTP endpoints: one module per route family, each a thin handler over protocol/ and the engine."""
