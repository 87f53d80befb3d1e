"""The README stays a short product page, every page it and docs/ link to exists, and every eval set has a role."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from sourcegate.pipelines import config

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")
EVALS = ROOT / "config" / "evals"
ROLES = {"fit", "check", "next-check", "training", "retired", "precision", "pool", "log"}


def test_the_readme_is_at_most_250_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines: move the detail under docs/"


def test_the_readme_is_at_most_10000_characters():
    chars = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert chars <= 10_000, f"README.md has {chars} characters: move the detail under docs/"


def test_the_readme_states_the_commands_what_they_need_and_the_exit_codes():
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    for needed in ("make run", "make test", "make check", "Python 3.11", "Java 17", "Maven"):
        assert needed in text, f"README.md no longer says {needed!r}"
    assert re.search(r"\*\*0\*\* the gate passed, \*\*1\*\* the gate failed, \*\*2\*\* anything else", text), (
        "README.md must state the exit codes: 0 passed, 1 the gate failed, 2 anything else"
    )


def test_every_relative_link_in_the_readme_and_docs_resolves():
    pages = [ROOT / "README.md", EVALS / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [
        f"{page.relative_to(ROOT)} -> {target}"
        for page in pages
        for target, _ in LINK.findall(page.read_text(encoding="utf-8"))
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert not broken, "broken links:\n" + "\n".join(broken)


def set_roles() -> dict[str, str]:
    """config/evals/sets.yaml as {file name: role}; a file listed twice fails here, not silently."""
    entries = yaml.safe_load((EVALS / "sets.yaml").read_text(encoding="utf-8"))["sets"]
    counts = Counter(entry["file"] for entry in entries)
    twice = sorted(name for name, n in counts.items() if n > 1)
    assert not twice, f"config/evals/sets.yaml lists these files more than once: {twice}"
    unknown = sorted(f"{e['file']}: {e['role']}" for e in entries if e["role"] not in ROLES)
    assert not unknown, f"roles not in {sorted(ROLES)}: {unknown}"
    assert all(str(e.get("provenance", "")).strip() for e in entries), "every set names its provenance"
    return {entry["file"]: entry["role"] for entry in entries}


def test_every_eval_set_file_has_exactly_one_role():
    roles = set_roles()
    on_disk = {str(path.relative_to(EVALS)) for path in EVALS.rglob("*.jsonl")}
    assert sorted(on_disk - roles.keys()) == [], "eval sets without a role in config/evals/sets.yaml"
    assert sorted(roles.keys() - on_disk) == [], "config/evals/sets.yaml names files that do not exist"


def test_the_shipped_config_reads_each_set_in_its_role():
    roles = set_roles()
    cfg = config.load(ROOT / "config" / "pipeline.yaml")
    wanted = {
        cfg.evals.calibration_set: "fit",
        cfg.evals.check_set: "check",
        cfg.evals.precision_set: "precision",
        cfg.evals.check_moves: "log",
    }
    for path, role in wanted.items():
        assert Path(path).parent == Path("config/evals"), path
        assert roles.get(Path(path).name) == role, (
            f"{path} is configured as {role}, sets.yaml says {roles.get(Path(path).name)}"
        )
    assert list(roles.values()).count("fit") == 1 and list(roles.values()).count("check") == 1


def test_no_shipped_answer_model_trained_on_a_set_that_places_or_checks_a_threshold():
    roles = set_roles()
    # A recipe of `train-in-domain` lists its training sets; the SQuAD model's names one dataset file instead.
    data = [json.loads(recipe.read_text(encoding="utf-8"))["data"] for recipe in (ROOT / "models").rglob("recipe.json")]
    trained_on = {
        Path(item["path"]).name
        for sets in data
        if isinstance(sets, list)
        for item in sets
        if Path(item["path"]).parent == Path("config/evals")
    }
    assert trained_on, "the recipes name training sets under config/evals"
    misplaced = sorted(f"{name}: {roles.get(name)}" for name in trained_on if roles.get(name) != "training")
    assert not misplaced, f"answer models trained on sets whose role is not training: {misplaced}"


def test_no_test_can_open_a_check_set():
    from tests.check_guard import GUARDED

    assert len(GUARDED) == 2  # the check set and the next one
    for path in GUARDED:
        with pytest.raises(PermissionError, match="tests never read check-set questions"):
            Path(path).read_text(encoding="utf-8")
