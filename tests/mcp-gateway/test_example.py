"""examples/mcp-git as its README runs it: the committed catalog as is, `mcp-server-git` found on
PATH, the repository named by SLUICE_EXAMPLE_GIT_REPO, a commit through the API, and the
repository's own log. And what `sluice catalog check` says of catalogs the real server cannot
satisfy."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest

from conftest import ADMIN_TOKEN, REPO, SLUICE, World, _wait_ready, free_port, new_run, submit, toml_str


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory, servers: pathlib.Path) -> Iterator[World]:
    root = tmp_path_factory.mktemp("example")
    repo = root / "demo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    for key, value in (("user.name", "Test"), ("user.email", "test@example.com")):
        subprocess.run(["git", "-C", str(repo), "config", key, value], check=True)
    (repo / "hello.txt").write_text("hello\n")
    subprocess.run(["git", "-C", str(repo), "add", "hello.txt"], check=True)
    port = free_port()
    (root / "sluice.toml").write_text(f"""
[ledger]
data_dir = {toml_str(root / 'ledger')}
[catalog]
path = {toml_str(REPO / 'examples' / 'mcp-git' / 'catalog.toml')}
[producer]
listen = "127.0.0.1:{port}"
[[auth.tokens]]
name = "admin"
role = "admin"
token = "{ADMIN_TOKEN}"
[[auth.tokens]]
name = "agent"
role = "agent"
token = "gw-agent-token-0123456789"
""")
    env = {**os.environ, "PATH": f"{servers}:{os.environ.get('PATH', '')}",
           "SLUICE_EXAMPLE_GIT_REPO": str(repo)}
    log = root / "sluice-dev.log"
    with log.open("wb") as sink:
        dev = subprocess.Popen([SLUICE, "dev", "--config", str(root / "sluice.toml"), "--log-level", "warn"],
                               stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, dev, log)
        yield World(url=url, bin=servers, root=root, repo=repo, files=root, memory_file=root / "none",
                    git_faults=None, fs_faults=None, memory_faults=None,  # type: ignore[arg-type]
                    repo_http=root, git_http_faults=None, log=log)  # type: ignore[arg-type]
    finally:
        dev.terminate()
        try:
            dev.wait(timeout=20)
        except subprocess.TimeoutExpired:
            dev.kill()


def test_the_example_catalog_commits_once_with_its_key(example: World) -> None:
    request = urllib.request.Request(f"{example.url}/v1/tools/git/git_commit",
                                     headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        tool = json.loads(answer.read())
    assert tool["semantics"] == "NON_IDEMPOTENT" and tool["status_check"] is True, tool

    run = new_run()
    args = {"repo_path": str(example.repo), "message": "add hello.txt"}
    done = submit(example, run, "git/git_commit", args)
    assert done["status"] == "CONFIRMED", done
    message = example.git("log", "-1", "--format=%B")
    assert message.strip() == f"add hello.txt\n\nSluice-Key: {run}/d-1/git/git_commit/0"
    assert done["idempotency_key"] == f"{run}/d-1/git/git_commit/0"

    again = submit(example, run, "git/git_commit", args)
    assert again["result"] == done["result"]
    assert example.git("rev-list", "--count", "HEAD").strip() == "1", "no second commit"


def catalog_check(path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SLUICE, "catalog", "check", "--catalog", str(path)], capture_output=True,
                          text=True, timeout=120)


def test_an_allowed_tool_the_server_does_not_list_is_a_load_error_naming_it(
        tmp_path: pathlib.Path, servers: pathlib.Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(f"""
[mcp_servers.git]
command = {toml_str(servers / 'mcp-server-git')}
args = ["--repository", {toml_str(tmp_path / 'repo')}]
allow = ["git_status", "git_push"]
""")
    checked = catalog_check(catalog)
    assert checked.returncode != 0
    assert str(catalog) in checked.stderr or "catalog.toml" in checked.stderr
    assert "mcp server git" in checked.stderr and "git_push" in checked.stderr
    assert "git_commit" in checked.stderr, "it says what the server does list"


def test_a_server_that_cannot_start_is_a_load_error_naming_it(tmp_path: pathlib.Path) -> None:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text("""
[mcp_servers.missing]
command = "/nonexistent/mcp-server"
allow = ["anything"]
""")
    checked = catalog_check(catalog)
    assert checked.returncode != 0
    assert "mcp server missing" in checked.stderr and "/nonexistent/mcp-server" in checked.stderr
