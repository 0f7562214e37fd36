"""``python -m agent_r1_plugin_search`` is ``agent-r1-search``."""

import sys

from agent_r1_plugin_search.cli import main

sys.exit(main())
