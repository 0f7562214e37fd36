"""agent-r1-plugin-search: multi-hop QA search for agent-r1."""

__version__ = "0.1.0"
