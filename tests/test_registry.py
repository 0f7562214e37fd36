"""The plugin registry with real plugin distributions discovered through importlib.metadata."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from foundation_helpers import ISOLATE, Sites, write_sites

from agent_r1 import ComponentConflict, ComponentNotFound, ConfigError, PluginError, Provenance
from agent_r1.config import RunConfig, validate_components
from agent_r1.contracts import KINDS
from agent_r1.registry import PluginLoadWarning, Registry

ACME = Provenance("acme", "agent-r1-plugin-acme", "1.2.3", "acme_agent_plugin")

ACME_COMPONENTS = {
    "tools": ["echo"],
    "environments": ["echo_env"],
    "tool_call_formats": ["line"],
    "reward_shapers": ["length"],
    "advantage_estimators": ["constant"],
    "policy_losses": ["sign"],
    "algorithms": ["acme_pg"],
    "rollout_backends": ["noop"],
    "trackers": ["memory"],
    "datasets": ["counting"],
}


def acme_run_config(**sections: object) -> RunConfig:
    """A run config whose every component comes from the acme plugin."""
    data: dict[str, object] = {
        "data": {"name": "counting"},
        "environment": {"name": "echo_env"},
        "rollout": {"backend": {"name": "noop"}},
        "algorithm": {"name": "acme_pg"},
        "rewards": [{"name": "length"}],
        "trackers": [{"name": "memory"}],
    }
    data.update(sections)
    return RunConfig.model_validate(data)


@pytest.fixture(scope="session")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Sites:
    return write_sites(tmp_path_factory.mktemp("plugin-sites"))


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the test distributions count: the bundled and search plugins are disabled, and no
    plugin variable leaks in from the environment."""
    for name in ("AGENT_R1_LOAD_PLUGINS", "AGENT_R1_STRICT_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGENT_R1_DISABLE_PLUGINS", ISOLATE)


@pytest.fixture
def events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv("ACME_EVENTS", str(path))
    return path


@pytest.fixture
def acme(sites: Sites) -> Iterator[Registry]:
    with sites.on_path("acme"):
        yield Registry()


# --------------------------------------------------------------------------------------------
# Discovery and provenance
# --------------------------------------------------------------------------------------------


def test_test_distribution_is_visible_to_importlib_metadata(sites: Sites) -> None:
    with sites.on_path("acme"):
        distribution = importlib.metadata.distribution("agent-r1-plugin-acme")
        assert distribution.version == "1.2.3"
        points = [ep for ep in distribution.entry_points if ep.group == "agent_r1"]
        assert [(ep.name, ep.value) for ep in points] == [("acme", "acme_agent_plugin")]
        assert distribution.files is not None and any(f.name == "RECORD" for f in distribution.files)
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("agent-r1-plugin-acme")


@pytest.mark.covers_hook("register_tools")
@pytest.mark.covers_hook("register_environments")
@pytest.mark.covers_hook("register_tool_call_formats")
@pytest.mark.covers_hook("register_reward_shapers")
@pytest.mark.covers_hook("register_advantage_estimators")
@pytest.mark.covers_hook("register_policy_losses")
@pytest.mark.covers_hook("register_algorithms")
@pytest.mark.covers_hook("register_rollout_backends")
@pytest.mark.covers_hook("register_trackers")
@pytest.mark.covers_hook("register_datasets")
@pytest.mark.parametrize("kind", KINDS)
def test_every_registration_hook_registers_its_kind_with_provenance(acme: Registry, kind: str) -> None:
    assert acme.names(kind) == ACME_COMPONENTS[kind]
    cls = acme.get(kind, ACME_COMPONENTS[kind][0])
    assert cls.kind == kind
    assert cls.provenance == ACME
    assert acme.build(kind, cls.name).config == cls.Config()


def test_plugins_lists_distribution_version_entry_point_and_components(acme: Registry) -> None:
    infos = {info.name: info for info in acme.plugins()}
    assert infos["builtins"].status == "disabled"
    info = infos["acme"].as_dict()
    assert info == {
        "name": "acme",
        "distribution": "agent-r1-plugin-acme",
        "version": "1.2.3",
        "module": "acme_agent_plugin",
        "status": "loaded",
        "errors": [],
        "components": {**ACME_COMPONENTS, "commands": ["acme-hello"]},
    }
    again = {i.name: i for i in acme.plugins()}["acme"].as_dict()
    assert again == info, "listing twice must not duplicate components"


def test_loading_is_lazy_and_import_loads_no_plugin(sites: Sites) -> None:
    import agent_r1

    assert agent_r1.__version__
    with sites.on_path("acme"):
        registry = Registry()
        assert "acme_agent_plugin" not in sys.modules
        registry.names("tools")
        assert "acme_agent_plugin" in sys.modules
    assert "acme_agent_plugin" not in sys.modules


def test_in_process_plugin_rebuilds_tables_without_duplicates(acme: Registry, sites: Sites) -> None:
    from agent_r1.testing import toy

    assert acme.names("datasets") == ["counting"]
    acme.register_plugin(toy, "toy", distribution="agent-r1-tests", version="9")
    assert acme.names("datasets") == ["counting", "toy_target"]
    assert acme.get("datasets", "toy_target").provenance == Provenance(
        "toy", "agent-r1-tests", "9", "agent_r1.testing.toy"
    )
    infos = {info.name: info for info in acme.plugins()}
    assert infos["acme"].components["datasets"] == ["counting"]


# --------------------------------------------------------------------------------------------
# Broken plugins
# --------------------------------------------------------------------------------------------


def test_an_import_error_is_one_warning_naming_distribution_version_and_module(sites: Sites) -> None:
    with sites.on_path("acme", "broken_import"):
        registry = Registry()
        with pytest.warns(PluginLoadWarning) as caught:
            assert registry.get("tools", "echo").provenance == ACME
        messages = [str(w.message) for w in caught if issubclass(w.category, PluginLoadWarning)]
        assert len(messages) == 1
        message = messages[0]
        for part in (
            "plugin 'broken_import'",
            "distribution agent-r1-plugin-broken-import 0.0.1",
            "entry point broken_import = broken_import_plugin",
            "import failed: RuntimeError: boom: the broken plugin cannot start",
            "agent-r1 plugins doctor",
            "AGENT_R1_DISABLE_PLUGINS=broken_import",
        ):
            assert part in message
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            registry.get("environments", "echo_env")  # warned once, not on every lookup


@pytest.mark.covers_hook("register_tools")
@pytest.mark.covers_hook("register_environments")
@pytest.mark.covers_hook("register_reward_shapers")
def test_bad_classes_missing_names_and_raising_hooks_are_reported(sites: Sites) -> None:
    with sites.on_path("acme", "bad_class"), pytest.warns(PluginLoadWarning):
        registry = Registry()
        assert registry.names("tools") == ["echo"]
        assert registry.names("environments") == ["echo_env", "loose_env"]
        assert registry.names("reward_shapers") == ["length"]
        info = {i.name: i for i in registry.plugins()}["bad_class"]
    assert info.status == "broken"
    errors = "\n".join(info.errors)
    assert "register_tools() returned <class 'bad_class_plugin.NotATool'>" in errors
    assert "NotATool does not subclass agent_r1.Tool" in errors
    assert "NamelessEnv has no 'name'" in errors
    assert "register_reward_shapers() raised ValueError: reward table is missing" in errors
    assert "bad_class_plugin.py" in errors, "the failing line is named"


def test_looking_up_a_rejected_component_explains_why(sites: Sites) -> None:
    with sites.on_path("bad_class"), pytest.warns(PluginLoadWarning):
        registry = Registry()
        with pytest.raises(ComponentNotFound) as caught:
            registry.get("tools", "bad_tool")
    message = str(caught.value)
    assert "tool 'bad_tool' is provided by plugin 'bad_class'" in message
    assert "agent-r1-plugin-bad-class" in message
    assert "does not subclass agent_r1.Tool" in message


def test_a_hookimpl_that_is_not_a_hook_breaks_its_plugin(sites: Sites) -> None:
    with sites.on_path("typo", "acme"), pytest.warns(PluginLoadWarning, match="register_toolz"):
        registry = Registry()
        assert registry.names("tools") == ["echo"]
    info = {i.name: i for i in registry.plugins()}["typo"]
    assert info.status == "broken"
    assert "implements 'register_toolz', which is not an agent-r1 hook" in info.errors[0]
    assert "Did you mean 'register_tools'?" in info.errors[0]


def test_a_run_that_uses_a_broken_plugin_fails_before_any_model_loads(sites: Sites) -> None:
    with sites.on_path("acme", "broken_import"), pytest.warns(PluginLoadWarning):
        registry = Registry()
        config = acme_run_config(environment={"name": "broken_env"})
        with pytest.raises(ConfigError) as caught:
            validate_components(config, registry)
    message = str(caught.value)
    assert caught.value.path == "environment.name"
    assert "unknown environment 'broken_env'" in message
    assert "plugin 'broken_import' (distribution agent-r1-plugin-broken-import 0.0.1" in message
    assert "RuntimeError: boom" in message


def test_a_run_that_uses_a_raising_hook_names_the_plugin(sites: Sites) -> None:
    with sites.on_path("acme", "bad_class"), pytest.warns(PluginLoadWarning):
        registry = Registry()
        config = acme_run_config(rewards=[{"name": "table_lookup"}])
        with pytest.raises(ConfigError) as caught:
            validate_components(config, registry)
    assert caught.value.path == "rewards[0].name"
    assert "reward table is missing" in str(caught.value)
    assert "Known reward shapers: length" in str(caught.value)


def test_an_unrelated_broken_plugin_does_not_stop_a_run(sites: Sites) -> None:
    with sites.on_path("acme", "broken_import"), pytest.warns(PluginLoadWarning):
        resolved = validate_components(acme_run_config(), Registry())
    assert {c.path: c.cls.provenance for c in resolved}["environment"] == ACME


# --------------------------------------------------------------------------------------------
# Conflicts
# --------------------------------------------------------------------------------------------


def test_a_name_provided_by_two_distributions_is_an_error_naming_both(sites: Sites) -> None:
    with sites.on_path("acme", "other"):
        registry = Registry()
        with pytest.raises(ComponentConflict) as caught:
            registry.get("tools", "echo")
        message = str(caught.value)
        assert "tool 'echo' is provided by more than one plugin" in message
        assert "agent-r1-plugin-acme 1.2.3" in message
        assert "agent-r1-plugin-other 0.1.0" in message
        assert "acme_agent_plugin.EchoTool" in message and "other_agent_plugin.OtherEcho" in message
        assert "'acme:echo' or 'other:echo'" in message
        assert "AGENT_R1_DISABLE_PLUGINS" in message
        assert [r.plugin.name for r in registry.providers("tools", "echo")] == ["acme", "other"]


def test_plugin_colon_name_picks_a_provider(sites: Sites) -> None:
    with sites.on_path("acme", "other"):
        registry = Registry()
        assert registry.get("tools", "acme:echo").provenance == ACME
        shouting = registry.build("tools", "agent-r1-plugin-other:echo")  # distribution name works too
        assert shouting.run(shouting.Arguments(text="hi")) == "HI"
        with pytest.raises(ComponentNotFound, match="no plugin named 'nobody' provides tool 'echo'"):
            registry.get("tools", "nobody:echo")


def test_a_conflict_in_a_run_config_says_how_to_choose(sites: Sites) -> None:
    with sites.on_path("acme", "other"):
        registry = Registry()
        with pytest.raises(ConfigError) as caught:
            validate_components(acme_run_config(), registry)
        assert caught.value.path == "environment.name"
        assert "'acme:echo_env' or 'other:echo_env'" in str(caught.value)
        resolved = validate_components(acme_run_config(environment={"name": "acme:echo_env"}), registry)
        assert {c.path: c.cls.provenance for c in resolved}["environment"] == ACME


def test_doctor_reports_conflicts_and_loose_configs(sites: Sites) -> None:
    with sites.on_path("acme", "other", "bad_class"), warnings.catch_warnings():
        warnings.simplefilter("error")  # doctor reports; it does not warn
        infos = {info.name: info for info in Registry().doctor()}
    assert "tool 'echo' is also provided by other" in "\n".join(infos["acme"].errors)
    assert "command 'acme-hello' is also provided by other" in "\n".join(infos["acme"].errors)
    assert "environment 'loose_env': LooseConfigEnv.Config accepts unknown keys" in "\n".join(
        infos["bad_class"].errors
    )


# --------------------------------------------------------------------------------------------
# Strict mode, allow and block lists
# --------------------------------------------------------------------------------------------


def test_strict_mode_turns_a_broken_plugin_into_an_error(
    sites: Sites, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_R1_STRICT_PLUGINS", "1")
    with sites.on_path("acme", "broken_import"):
        registry = Registry()
        for _ in range(2):  # every lookup fails, not only the first
            with pytest.raises(PluginError) as caught:
                registry.get("tools", "echo")
            assert "AGENT_R1_STRICT_PLUGINS is set" in str(caught.value)
            assert "agent-r1-plugin-broken-import 0.0.1" in str(caught.value)
        infos = {info.name: info for info in registry.doctor()}  # doctor still reports
        assert infos["broken_import"].status == "broken"


def test_strict_mode_rejects_a_bad_class(sites: Sites, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_R1_STRICT_PLUGINS", "true")
    with sites.on_path("bad_class"):
        registry = Registry()
        with pytest.raises(PluginError, match=r"NotATool does not subclass agent_r1\.Tool"):
            registry.names("tools")


def test_strict_mode_is_quiet_when_everything_loads(sites: Sites, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_R1_STRICT_PLUGINS", "1")
    with sites.on_path("acme"), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Registry().names("tools") == ["echo"]


@pytest.mark.parametrize("allowed", ["acme", "agent-r1-plugin-acme"])
def test_allowlist_loads_only_the_named_plugins(
    sites: Sites, monkeypatch: pytest.MonkeyPatch, allowed: str
) -> None:
    monkeypatch.setenv("AGENT_R1_LOAD_PLUGINS", f" {allowed} ,")
    with sites.on_path("acme", "other", "broken_import"), warnings.catch_warnings():
        warnings.simplefilter("error")  # the broken plugin is never imported, so never warns
        registry = Registry()
        assert registry.get("tools", "echo").provenance == ACME  # no conflict with `other`
        status = {info.name: info.status for info in registry.plugins()}
        assert "broken_import_plugin" not in sys.modules
    assert status == {"builtins": "disabled", "search": "disabled", **status}
    assert (status["acme"], status["other"], status["broken_import"]) == ("loaded", "disabled", "disabled")


def test_allowlist_keeps_the_bundled_plugin(sites: Sites, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_R1_LOAD_PLUGINS", "acme")
    monkeypatch.setenv("AGENT_R1_DISABLE_PLUGINS", "")
    with sites.on_path("acme"):
        registry = Registry()
        registry.load()
        assert registry.pm.get_plugin("builtins") is not None
        assert registry.pm.get_plugin("acme") is not None
        assert registry.pm.get_plugin("search") is None


def test_blocklist_disables_plugins_and_lookups_say_so(sites: Sites, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_R1_DISABLE_PLUGINS", f"{ISOLATE},broken_import,agent-r1-plugin-other")
    with sites.on_path("acme", "other", "broken_import"), warnings.catch_warnings():
        warnings.simplefilter("error")
        registry = Registry()
        assert registry.get("tools", "echo").provenance == ACME
        with pytest.raises(ComponentNotFound) as caught:
            registry.get("tools", "ecko")
    message = str(caught.value)
    assert "unknown tool 'ecko'. Did you mean 'echo'?" in message
    assert "Disabled by AGENT_R1_LOAD_PLUGINS/AGENT_R1_DISABLE_PLUGINS" in message
    assert "other" in message and "broken_import" in message


# --------------------------------------------------------------------------------------------
# Observer hooks
# --------------------------------------------------------------------------------------------


@pytest.mark.covers_hook("on_train_start")
@pytest.mark.covers_hook("on_rollout_end")
@pytest.mark.covers_hook("on_update_end")
@pytest.mark.covers_hook("on_eval_end")
@pytest.mark.covers_hook("on_checkpoint")
@pytest.mark.covers_hook("on_train_end")
def test_notify_calls_every_observer_of_a_real_plugin(acme: Registry, events: Path, tmp_path: Path) -> None:
    from agent_r1.testing import example_trajectory

    run_dir = tmp_path / "run"
    acme.notify("on_train_start", run_dir=run_dir, config={"seed": 7})
    acme.notify("on_rollout_end", step=0, trajectories=[example_trajectory(), example_trajectory()])
    acme.notify("on_update_end", step=0, metrics={"reward/mean": 0.5})
    acme.notify("on_eval_end", step=0, report={"success": 0.25})
    acme.notify("on_checkpoint", step=1, path=run_dir / "checkpoints" / "step-1")
    acme.notify("on_train_end", run_dir=run_dir, metrics={"reward/mean": 0.5})
    received = [json.loads(line) for line in events.read_text(encoding="utf-8").splitlines()]
    assert received == [
        {"hook": "on_train_start", "run_dir": str(run_dir), "seed": 7},
        {"hook": "on_rollout_end", "step": 0, "count": 2},
        {"hook": "on_update_end", "step": 0, "metrics": {"reward/mean": 0.5}},
        {"hook": "on_eval_end", "step": 0, "success": 0.25},
        {"hook": "on_checkpoint", "step": 1, "path": str(run_dir / "checkpoints" / "step-1")},
        {"hook": "on_train_end", "run_dir": str(run_dir), "metrics": {"reward/mean": 0.5}},
    ]


@pytest.mark.covers_hook("on_update_end")
def test_a_raising_observer_is_a_warning_naming_its_plugin(sites: Sites, events: Path) -> None:
    with sites.on_path("acme", "bad_class"):
        registry = Registry()
        with pytest.warns(PluginLoadWarning) as caught:
            registry.notify("on_update_end", step=3, metrics={"reward/mean": 1.0})
    messages = [str(w.message) for w in caught if "on_update_end" in str(w.message)]
    assert len(messages) == 1
    assert "plugin 'bad_class' (distribution agent-r1-plugin-bad-class 0.1.0" in messages[0]
    assert "RuntimeError: observer failed at step 3" in messages[0]
    assert json.loads(events.read_text(encoding="utf-8"))["hook"] == "on_update_end"  # others still ran


def test_notify_checks_the_hook_and_its_arguments(acme: Registry) -> None:
    with pytest.raises(ValueError, match="'register_tools' is not an observer hook"):
        acme.notify("register_tools")
    with pytest.raises(ValueError, match="on_train_start"):
        acme.notify("on_step_end", step=1)
    with pytest.raises(TypeError, match=r"on_update_end takes exactly the arguments \['metrics', 'step'\]"):
        acme.notify("on_update_end", step=1)


def test_an_in_process_plugin_with_a_typo_warns_or_fails_under_strict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    from agent_r1 import hookimpl

    plugin = types.ModuleType("typo_in_process")

    @hookimpl
    def on_trian_end(run_dir: Path, metrics: dict[str, float]) -> None:  # misspelt on purpose
        pass

    plugin.on_trian_end = on_trian_end  # type: ignore[attr-defined]
    with pytest.warns(PluginLoadWarning, match="Did you mean 'on_train_end'"):
        info = Registry(entry_points=False).register_plugin(plugin, "typo_in_process")
    assert info.status == "broken"
    monkeypatch.setenv("AGENT_R1_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="'on_trian_end', which is not an agent-r1 hook"):
        Registry(entry_points=False).register_plugin(plugin, "typo_in_process")


# --------------------------------------------------------------------------------------------
# Python paths next to plugin:name (more in test_python_path_components.py)
# --------------------------------------------------------------------------------------------


def test_plugin_name_and_python_path_readings_of_a_colon(sites: Sites) -> None:
    with sites.on_path("acme", "other"):
        registry = Registry()
        echo = registry.get("tools", "acme:echo")
        # the part before ':' is no plugin, so this is the module of the acme plugin, by Python path
        assert registry.get("tools", "acme_agent_plugin:EchoTool") is echo
        assert echo.provenance == ACME, "a plugin's class keeps the plugin's provenance"
        with pytest.raises(ComponentNotFound) as caught:
            registry.get("tools", "acme:EchoTool")  # a plugin name: never read as a module
        assert "plugin 'acme' (distribution agent-r1-plugin-acme 1.2.3" in str(caught.value)
        assert "provides no tool 'EchoTool' (its tools: echo" in str(caught.value)


def test_a_python_path_into_an_installed_distribution_records_it(tmp_path: Path) -> None:
    from agent_r1.testing import PluginDistribution, plugin_path

    library = PluginDistribution(
        "acme-reward-library",
        {"acme_reward_library.py": "def brevity(trajectory, task):\n    return 1.0\n"},
        {},
        version="0.3.0",
    )
    library.write(tmp_path)
    with plugin_path(tmp_path):
        try:
            cls = Registry().get("reward_shapers", "acme_reward_library:brevity")
        finally:
            sys.modules.pop("acme_reward_library", None)
    assert cls.provenance == Provenance(
        "(python path)", "acme-reward-library", "0.3.0", "acme_reward_library:brevity"
    )
