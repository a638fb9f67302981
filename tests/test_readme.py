"""The README's two opening commands stay true, and CI runs the test command verbatim."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def opening_commands():
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    return blocks[0].strip(), blocks[1].strip()


def test_ci_runs_the_readme_test_command_verbatim():
    _, test_command = opening_commands()
    ci_lines = [l for l in (ROOT / ".ci/run").read_text().splitlines() if l and not l.startswith("#")]
    assert test_command in ci_lines


def test_readme_serve_command_installs_and_serves():
    serve_command, _ = opening_commands()
    assert "pip install ." in serve_command and serve_command.endswith("cobatch serve")
