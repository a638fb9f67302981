"""The README and docs/ stay true to the code: the two opening commands (CI runs the test command
verbatim), every `cobatch` command parses with the real CLI parsers, every curl body passes the
routes' own validation, links and anchors resolve, every docs page is reachable from the README,
the generated configuration page is current, the module map names every module, and each
headline figure matches its stored run. None of this loads the model."""
import argparse
import ast
import glob
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "server" / "README.md"]
# The history quotes the commands of past runs as they were run; flags may have changed since.
HISTORICAL = {ROOT / "docs" / "benchmark-history.md"}
SERVED_MODEL = "gemma-3-270m-Q4_K_M"  # the bundled model's file stem, what /v1/models lists
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.S | re.M)


def opening_commands():
    blocks = re.findall(r"```bash\n(.*?)\n```", README.read_text(), re.S)
    return blocks[0].strip(), blocks[1].strip()


def test_ci_runs_the_readme_test_command_verbatim():
    _, test_command = opening_commands()
    ci_lines = [l for l in (ROOT / ".ci/run").read_text().splitlines() if l and not l.startswith("#")]
    assert test_command in ci_lines


def test_readme_serve_command_installs_and_serves():
    serve_command, _ = opening_commands()
    assert "pip install ." in serve_command and serve_command.endswith("cobatch serve")


# ---- commands -----------------------------------------------------------------------------------

def _fenced(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def _without_fences(text: str) -> str:
    return FENCE.sub("", text)


def _commands(block: str, program: str) -> list[str]:
    """Each command in a shell block starting with `program`, continuation lines joined."""
    commands, current = [], None
    for line in block.splitlines():
        stripped = line.strip()
        starts = re.match(rf"(\S*/)?{program}\s", stripped + " ")
        if starts:
            current = [stripped]
            commands.append(current)
        elif current is not None and stripped and not stripped.startswith("#") and (
                current[-1].endswith("\\") or _open_quote(" ".join(current))):
            current.append(stripped)
        else:
            current = None
    return [" ".join(part.rstrip("\\").strip() for part in c) for c in commands]


def _open_quote(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
        return False
    except ValueError:
        return True


def _is_placeholder(command: str) -> bool:
    """A synopsis rather than a command: options in brackets, alternatives, or an all-caps name."""
    return any(mark in command for mark in ("[", "|", "<", "...")) or any(
        re.fullmatch(r"[A-Z][A-Z_]*", token) for token in shlex.split(command, comments=True))


def documented_cobatch_commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        if page in HISTORICAL:
            continue
        text = page.read_text(encoding="utf-8")
        for _, block in _fenced(text):
            found += [(page.name, c) for c in _commands(block, "cobatch")]
        for span in re.findall(r"`(cobatch [^`]+)`", _without_fences(text)):
            found.append((page.name, span))
    return [(name, c) for name, c in found if not _is_placeholder(c)]


class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


COMMANDS = documented_cobatch_commands()


def test_the_docs_show_commands_to_check():
    assert len(COMMANDS) >= 15 and any("bench" in c for _, c in COMMANDS)


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_documented_command_parses(page, command, monkeypatch):
    from server import cli

    argv = shlex.split(command, comments=True)[1:]
    if len(argv) == 1:  # prose naming a subcommand (`cobatch batch`), not running it
        assert argv[0] in ("serve", "batch", "bench"), command
        return
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    try:
        cli.main(argv)
    except _Parsed as parsed:
        if argv[0] in ("serve", "batch"):
            assert cli._engine_options_problem(parsed.namespace) is None, command
        return
    except ImportError as exc:  # a benchmark whose optional extra is not installed here
        pytest.skip(f"{command}: {exc}")
    except SystemExit as exc:
        assert exc.code == 0, f"{page}: `{command}` does not parse (exit {exc.code})"
        return
    pytest.fail(f"{page}: `{command}` never reached its parser")


# ---- curl bodies ---------------------------------------------------------------------------------

def documented_curl_bodies() -> list[tuple[str, str, dict]]:
    found = []
    for page in PAGES:
        for _, block in _fenced(page.read_text(encoding="utf-8")):
            for command in _commands(block, "curl"):
                argv = shlex.split(command, comments=True)
                url = next(a for a in argv if a.startswith("http"))
                path = re.sub(r"^https?://[^/]+", "", url)
                if "-d" in argv:
                    found.append((page.name, path, json.loads(argv[argv.index("-d") + 1])))
    return found


CURLS = documented_curl_bodies()


def _validate_batch(body: dict) -> None:
    from server.jobs.input_file import ENDPOINTS
    from server.jobs.routes import COMPLETION_WINDOWS

    assert set(body) <= {"input_file_id", "endpoint", "completion_window", "metadata"}
    assert isinstance(body["input_file_id"], str)
    assert body["endpoint"] in ENDPOINTS and body["completion_window"] in COMPLETION_WINDOWS


def test_the_docs_show_curl_bodies_for_each_generation_route():
    assert {"/generate", "/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses",
            "/v1/batches"} <= {
        p for _, p, _ in CURLS}


@pytest.mark.parametrize("page,path,body", CURLS, ids=[f"{p}:{path}:{i}" for i, (p, path, _) in enumerate(CURLS)])
def test_documented_curl_body_passes_the_routes_validation(page, path, body):
    from server.anthropic_schemas import parse_count_tokens_body, parse_messages_body
    from server.openai_schemas import parse_chat, parse_completion
    from server.responses_schemas import parse_responses_body
    from server.schemas import parse_generate

    parsers = {"/generate": parse_generate, "/v1/completions": parse_completion, "/v1/chat/completions": parse_chat,
               "/v1/messages": parse_messages_body, "/v1/messages/count_tokens": parse_count_tokens_body,
               "/v1/responses": parse_responses_body}
    if path == "/v1/batches":
        _validate_batch(body)
        return
    assert path in parsers, f"{page}: a curl body for {path}, which this test does not know"
    parsers[path](body, n_ctx=8192)  # raises the same 400 the route would
    if path.startswith("/v1/"):
        assert body["model"] == SERVED_MODEL, f"{page}: the /v1 routes answer 404 to model {body['model']!r}"


def test_documented_python_parses():
    for page in PAGES:
        for language, block in _fenced(page.read_text(encoding="utf-8")):
            if language == "python":
                ast.parse(block, filename=str(page))


# ---- links ---------------------------------------------------------------------------------------

def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _without_fences(page.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = _slug(m.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _links(page: Path) -> list[str]:
    text = _without_fences(page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for link in _links(page):
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(link)
        elif anchor and (path.suffix != ".md" or anchor not in _anchors(path)):
            broken.append(link)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def test_every_docs_page_is_reachable_from_the_readme():
    reached, todo = set(), [README.resolve()]
    while todo:
        page = todo.pop()
        if page in reached or page.suffix != ".md" or not page.exists():
            continue
        reached.add(page)
        todo += [(page.parent / link.partition("#")[0]).resolve() for link in _links(page) if link.partition("#")[0]]
    missing = [p.name for p in DOCS if p.resolve() not in reached]
    assert not missing, f"not reachable from README.md: {missing}"


# ---- generated and checked content ---------------------------------------------------------------

def test_configuration_page_is_current():
    from server.config_doc import COMMAND, OUTPUT, render

    assert OUTPUT.read_text(encoding="utf-8") == render(), f"docs/configuration.md is stale: run `{COMMAND}`"


def test_configuration_page_names_every_setting_and_flag():
    from dataclasses import fields

    from engine.config import EngineConfig
    from server.cli import engine_flag

    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for f in fields(EngineConfig):
        assert f"`{f.name}`" in text and f"`{engine_flag(f)}" in text, f.name
    for flag in ("--api-key", "--data-dir", "--replicas", "--drain-timeout", "--in-flight"):
        assert f"`{flag}`" in text


def test_architecture_module_tables_are_current():
    from server.module_doc import COMMAND, OUTPUT, render

    assert OUTPUT.read_text(encoding="utf-8") == render(), f"docs/architecture.md's module tables are stale: run `{COMMAND}`"


def test_architecture_names_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = [p for pattern in ("bindings", "engine", "sampling", "sampling/grammar", "sampling/grammar/csrc", "server",
                                 "server/cluster", "server/jobs", "server/web", "bench") for p in sorted(glob.glob(str(ROOT / pattern / "*.py")))]
    modules.append(str(ROOT / "setup.py"))
    missing = [str(Path(p).relative_to(ROOT)) for p in modules if not p.endswith("__init__.py")
               and f"`{Path(p).relative_to(ROOT)}`" not in text]
    assert not missing, f"docs/architecture.md lacks a line for {missing}"


def headline_rows(page: Path) -> list[dict]:
    rows = []
    for line in page.read_text(encoding="utf-8").splitlines():
        m = re.search(r"\[([^\]]+)\]\(([^)]*bench/results/([^/)]+)/summary\.md)\)\s*\|\s*$", line)
        if not m or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append({"figure": cells[1], "date": cells[2], "commit": cells[3], "run": m.group(3)})
    return rows


@pytest.mark.parametrize("page", ["README.md", "docs/benchmarks.md"])
def test_headline_figures_match_their_stored_runs(page):
    rows = headline_rows(ROOT / page)
    assert len(rows) >= 8
    for row in rows:
        run = ROOT / "bench" / "results" / row["run"]
        manifest = json.loads((run / "manifest.json").read_text())
        summary = (run / "summary.md").read_text(encoding="utf-8")
        assert manifest["started_utc"][:10] == row["date"], row
        commit = row["commit"].split()[0]
        assert len(commit) >= 7 and manifest["git"]["commit"].startswith(commit), row
        assert ("(dirty)" in row["commit"]) == bool(manifest["git"]["dirty"]), row
        headline = [v for v in manifest["headline"].values() if isinstance(v, (int, float))]
        for number in re.findall(r"\d[\d,]*(?:\.\d+)?", row["figure"]):
            plain = number.replace(",", "")
            decimals = len(plain.partition(".")[2])
            in_summary = re.search(rf"(?<![\d.]){re.escape(plain)}(?![\d])", summary)
            in_headline = any(round(v * scale, decimals) == float(plain) for v in headline for scale in (1, 100))
            assert in_summary or in_headline, f"{page}: {number} is not in run {row['run']}"
