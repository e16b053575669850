"""Cheap static checks that the README and docs/ name real things, and that generated reference tables are current."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
# flags of the launchers in front of our entry points (not ours to check)
LAUNCHERS = {"deepspeed", "mpirun", "torchrun", "python", ".venv/bin/python", ".venv/bin/deepspeed", "bash"}


def _code_lines(path: Path) -> list[str]:
    """Shell lines of the ```bash blocks, continuation lines joined, comments dropped."""
    lines, block, buf = [], False, ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        if raw.startswith("```"):
            block = raw.strip() in ("```bash", "```sh", "```shell") if not block else False
            continue
        if not block:
            continue
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        lines.append(buf + line)
        buf = ""
    return [ln for ln in lines if ln.strip()]


def _entry_points(line: str) -> list[tuple[Path, list[str]]]:
    """(source file, flags given to it) for each of our modules/scripts the line runs."""
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    found = []
    for i, w in enumerate(words):
        src = None
        if (
            w == "-m"
            and i + 1 < len(words)
            and words[i + 1].split(".")[0] in ("data_pipeline", "tools", "pretrain", "benchmarks", "model")
        ):
            mod = words[i + 1]
            src = REPO / (mod.replace(".", "/") + ".py")
            if not src.exists():
                src = REPO / mod.replace(".", "/") / "__main__.py"
            assert src.exists(), f"`python -m {mod}` names no module in the repository"
            rest = words[i + 2 :]
        elif re.fullmatch(r"(run_scripts|pretrain|tools|benchmarks)/[\w/.-]+\.(py|sh)", w):
            src = REPO / w
            assert src.exists(), f"{w} does not exist"
            rest = words[i + 1 :]
        if src is not None:
            flags = []
            for r in rest:
                if r in ("|", "&&", ";", "||") or r.startswith(">"):
                    break
                if r.startswith("--"):
                    flags.append(r.split("=", 1)[0])
            found.append((src, flags))
    return found


def _flag_sources(src: Path) -> str:
    """Text in which the entry point's flags are defined (train.py's live in pretrain/args.py)."""
    import importlib

    text = src.read_text(encoding="utf-8")
    if src in (REPO / "pretrain" / "train.py", REPO / "pretrain" / "__main__.py"):
        src = REPO / "pretrain" / "args.py"  # the trainer's parser lives there
    builders = re.findall(r"^def (\w*parser)\(\)", src.read_text(encoding="utf-8"), re.M) if src.suffix == ".py" else []
    if builders:  # flags generated from config dataclasses: ask the parsers (build_parser, samples_parser, ...)
        module = importlib.import_module(".".join(src.relative_to(REPO).with_suffix("").parts))
        for name in builders:
            text += " ".join(f'"{o}"' for a in getattr(module, name)()._actions for o in a.option_strings)
    for imported in re.findall(
        r"^from ((?:data_pipeline|tools|pretrain|benchmarks|common)\.[\w.]+) import", text, re.M
    ):
        p = REPO / (imported.replace(".", "/") + ".py")
        if p.exists():
            text += p.read_text(encoding="utf-8")
    return text


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_commands_in_docs_name_real_modules_scripts_and_flags(doc: Path) -> None:
    problems = []
    for line in _code_lines(doc):
        for src, flags in _entry_points(line):
            defined = _flag_sources(src)
            for flag in flags:
                if src.suffix == ".sh":
                    continue  # scripts forward their arguments; the script itself was checked to exist
                if f'"{flag}"' not in defined and f"'{flag}'" not in defined:
                    problems.append(f"{doc.name}: `{flag}` is not a flag of {src.relative_to(REPO)} in: {line.strip()}")
    assert not problems, "\n".join(problems)


def test_the_checker_catches_a_wrong_flag_and_a_missing_module(tmp_path: Path) -> None:
    bad = tmp_path / "bad.md"
    bad.write_text("```bash\npython -m tools.convert_checkpoint --load x --to-hff y\n```\n")
    ((src, flags),) = _entry_points(_code_lines(bad)[0])
    assert "--to-hff" in flags and '"--to-hff"' not in _flag_sources(src)
    with pytest.raises(AssertionError, match="no module"):
        _entry_points("python -m tools.no_such_tool --x")


def test_configuration_reference_is_generated_from_the_code() -> None:
    from tools import config_docs

    doc = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert config_docs.splice(doc, config_docs.generate(), "docs/configuration.md") == doc, (
        "docs/configuration.md is stale: run `python -m tools.config_docs --write docs/configuration.md`"
    )


def test_pattern_table_is_generated_from_the_registries() -> None:
    """docs/model.md's one table of block layouts and token masks (both registries)."""
    from tools import config_docs

    doc = (REPO / "docs" / "model.md").read_text(encoding="utf-8")
    generated = config_docs.generate("docs/model.md")
    assert "| `fixed` | block layout |" in generated and "| `fixed` | token mask |" in generated
    assert config_docs.splice(doc, generated, "docs/model.md") == doc, (
        "docs/model.md is stale: run `python -m tools.config_docs --write docs/model.md`"
    )


def test_relative_links_in_docs_resolve() -> None:
    missing = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            if not (doc.parent / target).exists():
                missing.append(f"{doc.name} -> {target}")
    assert not missing, missing


def test_json_model_config_examples_in_docs_are_valid() -> None:
    """Every ```json block in configuration.md is a model config that ModelConfig accepts."""
    import json

    from model.config import ModelConfig

    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```json\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        ModelConfig.from_dict(json.loads(block))


# "session" as a word; a hyphen or dot around it marks an identifier (pytest's `--session-timeout`, `xdist.dsession`).
SESSION_WORD = re.compile(r"(?<![-\w.])sessions?(?![-\w])", re.I)


def test_docs_speak_of_the_product_not_of_how_it_was_made() -> None:
    """Docs say what was measured, on what machine and when (a date), never "this session" (issue #42)."""
    assert SESSION_WORD.findall("no GPU this session; two Sessions") == ["session", "Sessions"]
    assert not SESSION_WORD.findall("pytest --session-timeout 45; xdist.dsession.Interrupted")
    docs = [*DOCS, *sorted((REPO / "docs").glob("*/**/*.md"))]  # generated reports too
    found = [
        f"{doc.relative_to(REPO)}:{n}: {line.strip()[:100]}"
        for doc in docs
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if SESSION_WORD.search(line)
    ]
    assert not found, "say what was measured, on what machine and when (a date), not 'session':\n" + "\n".join(found)


def test_changelog_starts_with_the_unreleased_section() -> None:
    """Keep a Changelog's form: what reached main since the last dated section is under *Unreleased*, first."""
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog")
    first = re.search(r"^## .*$", text, re.M)
    assert first and first.group(0) == "## [Unreleased]", "CHANGELOG.md: the first section is '## [Unreleased]'"
