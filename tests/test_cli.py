"""`cobatch serve`'s engine flags come from EngineConfig's fields: one flag per field, its default
and help from the field, its check EngineConfig's own, reported with the flag's name."""
from __future__ import annotations

from dataclasses import fields

import pytest

from engine import EngineConfig
from server import cli


def test_every_engine_setting_has_a_documented_flag(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100000")  # one line per flag: argparse would wrap at hyphens
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for f in fields(EngineConfig):
        assert cli.engine_flag(f) in text, f"no flag for EngineConfig.{f.name}"
        assert " ".join(f.metadata["help"].split()) in text


def test_flag_defaults_are_the_engines_own_but_where_the_server_says_otherwise():
    chosen = cli.engine_options_from(cli._parser().parse_args(["serve"]))
    for f in fields(EngineConfig):
        if "serve_default" in f.metadata:
            continue
        assert chosen.get(f.name) == f.default, f.name  # a flag left at None leaves the Engine's default
    assert chosen["flash_attn"] is True and "n_threads" not in chosen  # the server's own defaults


def test_each_kind_of_flag_reaches_its_setting():
    options = cli._parser().parse_args([
        "serve", "--threads", "3", "--no-priority", "--flash-attn", "off", "--interactive-batch-rows", "0",
        "--no-jump-forward", "--interrupt-window", "0.25", "--block-size", "32", "--cache-holders", "8",
    ])
    chosen = cli.engine_options_from(options)
    assert chosen["n_threads"] == 3 and chosen["priority_scheduling"] is False and chosen["flash_attn"] is False
    assert chosen["interactive_batch_rows"] is None and chosen["jump_forward"] is False
    assert chosen["interrupt_window"] == 0.25 and chosen["block_size"] == 32 and chosen["cache_holders"] == 8
    config = EngineConfig(**chosen)
    assert config.n_threads == 3 and config.block_size == 32


@pytest.mark.parametrize("argv, message", [
    (["--max-batch", "16", "--step-token-budget", "8"], "--step-token-budget must be at least --max-running"),
    (["--cache-max-fraction", "1.5"], "--cache-max-fraction must be between 0 and 1"),
    (["--interactive-batch-rows", "-2"], "--interactive-batch-rows must be >= 1"),
    (["--batch-min-share", "1"], "--batch-min-share must be at least 0 and below 1"),
    (["--max-batch", "200", "--cache-holders", "100"], "--max-running + --cache-holders <= 256"),
    (["--draft-model", "/nowhere/draft.gguf"], "--draft-model /nowhere/draft.gguf: no such file"),
    (["--draft-model", __file__, "--speculative", "off"], "--draft-model needs --speculative auto (it is off)"),
])
def test_a_bad_setting_is_refused_before_anything_loads_naming_its_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", *argv])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_api_keys_are_read_once_and_a_bad_one_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COBATCH_API_KEY", "sk-env")
    keys = tmp_path / "keys"
    keys.write_text("sk-file\n")
    options = cli._parser().parse_args(["serve", "--api-key", "sk-flag", "--api-key-file", str(keys)])
    assert cli._api_keys(cli._parser(), options) == ("sk-flag", "sk-file", "sk-env")
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--api-key-file", str(tmp_path / "missing")])
    assert info.value.code == 2 and "API keys" in capsys.readouterr().err
