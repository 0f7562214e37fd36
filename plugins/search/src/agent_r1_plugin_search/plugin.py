"""Hook implementations of agent-r1-plugin-search (filled in as components land)."""
