"""agent_r1.models.kv: the KV cache goes to ``forward`` under the name the model declares, so the
`hf` backend and the trainer's shared-prefix passes run without transformers' deprecation warning
for ``past_key_values`` (transformers 5.2x renamed it ``cache``) and still work with models whose
``forward`` only knows the old name."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch

from agent_r1.models.kv import cache_keyword, output_cache, with_cache


class OldStyle(torch.nn.Module):
    """A model whose forward takes the cache as ``past_key_values`` (transformers before 5.2x)."""

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool = False) -> Any:
        return {"past_key_values": past_key_values}


def test_the_keyword_follows_the_forward_signature() -> None:
    from agent_r1.testing.models import tiny_model, tiny_tokenizer

    model = tiny_model(tiny_tokenizer())
    expected = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    assert cache_keyword(model) == expected
    assert cache_keyword(OldStyle()) == "past_key_values"
    assert with_cache(OldStyle(), "c") == {"past_key_values": "c"}
    assert with_cache(model, None) == {}


def test_a_cached_forward_and_generation_raise_no_deprecation_warning() -> None:
    from transformers import DynamicCache

    from agent_r1.builtins.hf_backend import HFBackend
    from agent_r1.contracts import SamplingParams
    from agent_r1.engine.learner.batch import StepPrefix, policy_forward
    from agent_r1.testing.models import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=1)
    ids = torch.tensor([[5, 9, 14, 3, 7, 8, 21, 30, 11, 12]] * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transformers' FutureWarning for the old name would raise here
        cache = DynamicCache()
        outputs = model(input_ids=ids[:1, :4], use_cache=True, **with_cache(model, cache))
        assert output_cache(outputs) is cache and cache.get_seq_length() == 4
        prefix = StepPrefix(model, ids[:1, :4])
        out = policy_forward(model, ids, torch.ones_like(ids, dtype=torch.bool), start=6, step_prefix=prefix)
        assert out.logprobs[:, 6:].lt(0).all()
        backend = HFBackend({}, model=model, tokenizer=tokenizer)
        generations = backend.generate([[5, 9, 14, 3]], SamplingParams(temperature=0.0, max_new_tokens=4))
        assert len(generations[0].token_ids) > 0
