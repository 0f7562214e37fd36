"""agent-r1-plugin-guess-number: a multi-turn number-guessing environment and its dataset.

The components and their registration hooks are in :mod:`agent_r1_plugin_guess_number.plugin`.
"""

__version__ = "0.1.0"
