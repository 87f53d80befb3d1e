"""A new decision is accepted with a fresh check to follow: the check set it saw is retired, the next-check set
becomes the check set.

A check set judges one decision once. `sourcegate accept` of a decision other than the accepted one has seen the
check set's scores (the run it accepts scored them), so those questions become fit data (sourcegate/evals/check_set.py
`move_to_fit`) and the set written blind for the next check (`next-check` in the roles file `sets.yaml` beside the
check set) becomes the check set: the roles file is rewritten line by line (its comments and provenance kept, a note
added) and the config's `evals.check_set` is switched by the caller. Without a next-check set (a new corpus's
first accept) the check set keeps only the questions the decision never saw, often none: accept says to write new
ones, and a night with an empty check set stops before scoring (exit 2), so no decision is checked on worn questions.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from sourcegate.artifact_io import write_text

ROLES = "sets.yaml"
NEXT_CHECK = "next-check"


def roles_file(check_path: str | Path) -> Path:
    return Path(check_path).parent / ROLES


def next_check(check_path: str | Path) -> Path | None:
    """The next-check set named in the roles file beside the check set (None: no roles file names one)."""
    roles = roles_file(check_path)
    entries = yaml.safe_load(roles.read_text(encoding="utf-8"))["sets"] if roles.is_file() else []
    fresh = [e["file"] for e in entries if e.get("role") == NEXT_CHECK and e["file"] != Path(check_path).name]
    if fresh and not (roles.parent / fresh[0]).is_file():
        raise FileNotFoundError(f"{roles} names the next-check set {fresh[0]}, which is not there")
    return roles.parent / fresh[0] if fresh else None


def with_role(text: str, file: str, role: str, note: str) -> str:
    """The roles file's text with `file`'s role set to `role` and `note` added to its provenance."""
    lines = text.splitlines(keepends=True)
    entry = re.compile(rf"^\s*-\s*file:\s*{re.escape(file)}\s*$")
    start = next((i for i, line in enumerate(lines) if entry.match(line)), None)
    if start is None:
        raise ValueError(f"{ROLES} names no set {file}")
    found_role = False
    for i in range(start + 1, len(lines)):
        if re.match(r"^\s*-\s*file:", lines[i]):
            break
        key = re.match(r"^(\s*)(role|provenance):(.*?)(\r?\n)?$", lines[i])
        if not key:
            continue
        indent, name, value, end = key.group(1), key.group(2), key.group(3), key.group(4) or ""
        if name == "role":
            lines[i], found_role = f"{indent}role: {role}{end}", True
        else:
            lines[i] = f"{indent}provenance:{value}; {note}{end}"
    if not found_role:
        raise ValueError(f"{ROLES}: the entry of {file} has no role line")
    return "".join(lines)


def rotate(check_path: str | Path, fresh: Path, source: str) -> Path:
    """Rewrite the roles file: the check set retired (its questions are fit data now), `fresh` the check set."""
    check_path, roles = Path(check_path), roles_file(check_path)
    text = roles.read_text(encoding="utf-8")
    text = with_role(text, check_path.name, "retired", f"its questions moved into the fit set by accept of {source}")
    text = with_role(text, fresh.name, "check", f"the check set since accept of {source}")
    yaml.safe_load(text)  # still the roles file it was
    return write_text(text, roles)
