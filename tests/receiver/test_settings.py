"""Receiver settings: defaults, env: secrets, strict validation, the CLI entry point."""

from __future__ import annotations

import pytest

from day0.cli import main
from day0.errors import ConfigError
from day0.receiver.settings import load_settings


def test_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    s = load_settings()
    assert (s.host, s.port, s.targets, s.max_body_bytes, s.replay_window_s) == (
        "127.0.0.1", 8787, ["cpu-bf16"], 1 << 20, 300)
    assert s.sns_allowed_hosts == [] and s.secrets.release_hmac is None
    assert s.prefect_csrf is False  # Prefect's server default: no CSRF protection, no probe
    # under the user's state folder, never /var/lib (root only)
    assert s.journal == str(tmp_path / "state" / "day0" / "receiver" / "journal.sqlite")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert load_settings().journal == str(tmp_path / "home/.local/state/day0/receiver/journal.sqlite")


def test_file_env_secrets_and_relative_journal(tmp_path, monkeypatch):
    monkeypatch.setenv("RELEASE_KEY", "from-env")
    cfg = tmp_path / "conf" / "receiver.yaml"
    cfg.parent.mkdir()
    cfg.write_text("journal: state/j.sqlite\nsecrets:\n  release_hmac: env:RELEASE_KEY\n"
                   "s3:\n  endpoint_url: http://127.0.0.1:1\n")
    s = load_settings(cfg)
    assert s.secrets.release_hmac.get_secret_value() == "from-env"
    assert "from-env" not in repr(s)  # secrets never print
    assert s.journal == str(cfg.parent / "state" / "j.sqlite")


def test_missing_env_secret_names_field(tmp_path, monkeypatch):
    monkeypatch.delenv("NOPE_NOT_SET", raising=False)
    cfg = tmp_path / "r.yaml"
    cfg.write_text("secrets:\n  hf_webhook: env:NOPE_NOT_SET\n")
    with pytest.raises(ConfigError, match="secrets.hf_webhook.*NOPE_NOT_SET"):
        load_settings(cfg)


def test_every_missing_secret_named_at_once(monkeypatch, capsys):
    """The shipped config with no secret exported: one error naming all five, exit 2."""
    from pathlib import Path

    names = ["DAY0_RELEASE_SECRET", "DAY0_HF_WEBHOOK_SECRET", "DAY0_SEAWEEDFS_TOKEN",
             "DAY0_S3_EVENTS_TOKEN", "DAY0_ADMIN_TOKEN"]
    for var in names:
        monkeypatch.delenv(var, raising=False)
    config = Path(__file__).resolve().parents[2] / "deploy" / "receiver.yaml"
    assert main(["hooks", "serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(var in err for var in names), err
    assert "secrets.release_hmac" in err and "secrets.admin_token" in err
    page = (Path(__file__).resolve().parents[2] / "docs" / "releases.md").read_text()
    assert all(f"`{var}`" in page for var in names)  # each one documented (Receiver secrets)


@pytest.mark.parametrize("text,why", [
    ("prot: 1\n", "did you mean 'port'"),
    ("deployment: validate\n", "flow-name/deployment-name"),
    ("flow_parameters: {source: x}\n", "unknown flow parameter"),
    ("max_body_bytes: 0\n", "greater than 0"),
    ("secrets: {token: x}\n", "unknown field 'token'"),
    ("targets: []\n", "at least 1"),
    ("flow_parameters: {trust_remote_code: true}\n", "flow_parameters.*set per source"),
    ("trust_remote_code: ['s3://models/../x']\n", "trust_remote_code.*'\\.\\.' segment"),
    ("release_sources: ['http://169.254.169.254/']\n", "release_sources.*s3://BUCKET/PREFIX"),
    ("hub: {source: 'file:///mirror/{repo}'}\n", "hub.source.*absolute folder"),
    ("limits: {header_timeout_s: 0}\n", "limits.header_timeout_s.*greater than 0"),
    ("checks: {timeout: 3}\n", "checks.*unknown field 'timeout'"),
    ("flow_parameters: {stage_configs: {performance: {promote_baseline: true}}}\n",
     "never set --promote-baseline"),
    ("flow_parameters: {options: {promote_baseline: true}}\n", "never set --promote-baseline"),
    # a release run always runs the full plan (issue 27): never partial, never bring-up
    ("flow_parameters: {stages: [alignment]}\n", "never set stages: a release run always runs "
                                                  "the full plan"),
    ("flow_parameters: {bring_up: true}\n", "never set bring_up"),
])
def test_bad_settings(tmp_path, text, why):
    cfg = tmp_path / "r.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=why):
        load_settings(cfg)


def test_cli_bad_config_exits_2(tmp_path, capsys):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("replay_window_s: -1\n")
    assert main(["hooks", "serve", "--config", str(cfg)]) == 2
    assert "replay_window_s" in capsys.readouterr().err


def test_shipped_deploy_config_loads(monkeypatch):
    from pathlib import Path

    from day0.receiver.settings import load_settings

    for var in ("DAY0_RELEASE_SECRET", "DAY0_HF_WEBHOOK_SECRET", "DAY0_SEAWEEDFS_TOKEN",
                "DAY0_S3_EVENTS_TOKEN", "DAY0_ADMIN_TOKEN"):
        monkeypatch.setenv(var, "x")
    settings = load_settings(Path(__file__).resolve().parents[2] / "deploy" / "receiver.yaml")
    assert settings.deployment == "validate/day0" and settings.hub.source.startswith("s3://")
    assert settings.release_sources == ["s3://models", "s3://hub-mirror"]
    assert settings.limits.header_timeout_s == 10 and settings.checks.timeout_s == 30
