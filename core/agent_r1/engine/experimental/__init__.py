"""Research features whose interface may still change: value-guided and best-of-K decoding
(:mod:`~agent_r1.engine.experimental.decoding`)."""
