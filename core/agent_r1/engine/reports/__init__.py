"""What a run reports: step statistics (:mod:`~agent_r1.engine.reports.stats`), evaluation summaries
(:mod:`~agent_r1.engine.reports.evaluation`), the HTML report and plots
(:mod:`~agent_r1.engine.reports.report`) and the trajectory viewer
(:mod:`~agent_r1.engine.reports.viewer`)."""
