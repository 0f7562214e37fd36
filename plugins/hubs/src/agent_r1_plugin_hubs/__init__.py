"""agent-r1-plugin-hubs: environments people already have, as agent-r1 components.

One distribution with an extra per family (``pip install 'agent-r1-plugin-hubs[reasoning-gym]'``,
``[textarena]``, ``[verifiers]``, ``[openenv]``): the families share the glue (a package check that
says what to install before any model loads, tasks built from a package's items, its scoring as
named reward signals), and each extra pins the release it is tested with, so a user installs only
the ecosystems they use. The components are registered whether or not their package is installed
(``agent-r1 plugins list`` shows them); using one without its package stops the run at
``agent-r1 check`` with the ``pip install`` line to run.
"""

from __future__ import annotations

__version__ = "0.1.0"
