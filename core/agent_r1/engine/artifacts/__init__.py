"""What a run leaves behind: checkpoints (:mod:`~agent_r1.engine.artifacts.checkpoint`), Hugging Face
exports (:mod:`~agent_r1.engine.artifacts.export`) and a trained critic's files
(:mod:`~agent_r1.engine.artifacts.critic_files`)."""
