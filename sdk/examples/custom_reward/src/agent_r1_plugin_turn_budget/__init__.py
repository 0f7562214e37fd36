"""agent-r1-plugin-turn-budget: reward shapers that favour short, correct episodes.

The shapers and their registration hook are in :mod:`agent_r1_plugin_turn_budget.plugin`.
"""

__version__ = "0.1.0"
