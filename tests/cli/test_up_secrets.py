"""``tessera up`` never takes a secret on its command line: ``--admin-token`` and a ``--db`` URL with a password are
refused with one line naming the variable to use; the token comes from ``TESSERA_ADMIN_TOKEN`` or
``--admin-token-file``, the URL from ``TESSERA_DB``, and both leave the server's environment once read. The run-as
mode and its start-up notice."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from cli_checks import assert_one_line_error
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.cli.up_secrets import admin_token_of, database_url, tenant_users
from tessera.errors import InvalidRequestError
from tessera.server import host

runner = CliRunner()


def test_up_refuses_a_token_or_a_password_on_its_command_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["up", "--admin-token", "s3cret-token", "--data-dir", str(tmp_path)])
    assert_one_line_error(result, "--admin-token", "TESSERA_ADMIN_TOKEN", "--admin-token-file")
    assert "s3cret-token" not in result.output
    result = runner.invoke(app, ["up", "--db", "postgresql://u:pw@127.0.0.1/db", "--data-dir", str(tmp_path)])
    assert_one_line_error(result, "--db", "password", "TESSERA_DB")
    result = runner.invoke(app, ["up", "--tenant-user", "nouser", "--data-dir", str(tmp_path)])
    assert_one_line_error(result, "--tenant-user", "TENANT=USER")


def test_secrets_come_from_the_environment_or_a_file_and_leave_the_environment(tmp_path: Path) -> None:
    environ = {"TESSERA_ADMIN_TOKEN": "from-env", "TESSERA_DB": "postgresql://u:pw@h/db", "OTHER": "kept"}
    assert admin_token_of(None, None, environ) == "from-env"
    assert database_url(None, environ) == "postgresql://u:pw@h/db"
    assert environ == {"OTHER": "kept"}
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert admin_token_of(None, token_file, {"TESSERA_ADMIN_TOKEN": "from-env"}) == "from-file"
    assert admin_token_of(None, None, {}) is None and database_url(None, {}) is None
    assert database_url("postgresql://u@h/db", {}) == "postgresql://u@h/db"  # no password: fine on a command line
    token_file.write_text("\n")
    with pytest.raises(InvalidRequestError, match="empty"):
        admin_token_of(None, token_file, {})
    with pytest.raises(InvalidRequestError, match="--admin-token-file"):
        admin_token_of(None, tmp_path / "missing", {})
    assert tenant_users(["a=alice", "b=bob"]) == (("a", "alice"), ("b", "bob"))
    with pytest.raises(InvalidRequestError, match="twice"):
        tenant_users(["a=alice", "a=bob"])


def test_run_as_modes_and_what_the_server_says_at_start_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert host.run_as_mode("auto") == "server"
    with pytest.raises(InvalidRequestError, match="--run-as"):
        host.run_as_mode("everyone")
    with pytest.raises(InvalidRequestError, match="needs the server to run as root"):
        host.tenant_accounts("tenant-users", tmp_path / "homes", {})
    with pytest.raises(InvalidRequestError, match="--tenant-user"):
        host.tenant_accounts("server", tmp_path / "homes", {"a": "alice"})
    level, text = host.isolation_notice("server", tmp_path)
    assert level == logging.WARNING and text.startswith("not running as root: workloads run as")
    assert "clean environment" in text
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert host.run_as_mode("auto") == "tenant-users"
    assert "workloads run as root" in host.isolation_notice("server", tmp_path)[1]


def test_the_server_makes_its_files_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "logs").mkdir(parents=True)
    (data / "logs" / "1.log").write_text("old log")
    (data / "tessera.db").write_text("")
    for path in (data, data / "logs"):
        path.chmod(0o755)
    (data / "logs" / "1.log").chmod(0o644)
    (data / "tessera.db").chmod(0o644)
    old = os.umask(0o022)
    try:
        host.make_private(data, homes_inside=True)
        assert os.umask(0o022) == host.SERVER_UMASK
    finally:
        os.umask(old)
    modes = {
        p.name: p.stat().st_mode & 0o777 for p in (data, data / "logs", data / "logs" / "1.log", data / "tessera.db")
    }
    assert modes == {"data": 0o711, "logs": 0o700, "1.log": 0o600, "tessera.db": 0o600}


def test_the_tenants_homes_are_absolute_even_for_a_relative_data_dir() -> None:
    """``tessera up``'s default data directory is relative; useradd refuses a relative home (every tenant workload of a
    root server started that way failed to launch)."""
    from tessera.server.up import UpConfig

    assert UpConfig(data_dir=Path(".tessera")).homes.is_absolute()
    assert UpConfig(data_dir=Path(".tessera")).homes == Path(".tessera", "homes").absolute()
