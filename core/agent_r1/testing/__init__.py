"""Testing helpers for plugin authors and for agent-r1's own tests.

``from agent_r1.testing import check_tool, PluginDistribution, plugin_path`` gives the contract
checkers and the plugin-distribution harness of :mod:`agent_r1.testing.plugins`. The tiny models
and tokenizers (:mod:`agent_r1.testing.models`) and the toy task (:mod:`agent_r1.testing.toy`)
need torch and are imported from their own modules.
"""

from __future__ import annotations

from agent_r1.testing import plugins as _plugins
from agent_r1.testing.plugins import *  # noqa: F403 - the public names, listed once in plugins.__all__

__all__ = list(_plugins.__all__)
