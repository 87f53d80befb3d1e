"""The wheel, installed outside the checkout: one top-level name, its templates, its CLI, and a user's DAG file.

The wheel is built from the package's own files, installed with --no-deps into a fresh venv whose only view of the
dependencies (Airflow among them) is this venv's site-packages listed in a .pth file. A plain path line in a .pth adds
that folder but runs none of the .pth files inside it, so the checkout's editable install stays invisible: the test
checks that `sourcegate` comes from the new venv and that the old top-level `pipelines` is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OLD_TOP_LEVEL = ("pipelines", "evals", "artifact_io")
USER_DAG = '''"""A data team's own Airflow DAG file: sourcegate's DAGs, built from the installed wheel."""

from sourcegate.dags import nightly_dag, recalibrate_dag

nightly = nightly_dag(dag_id="team_sourcegate_nightly")
recalibrate = recalibrate_dag()
'''
PROBE = """
import json, importlib.util, sourcegate
from sourcegate.evals import report
from sourcegate.plugins import reports
print(json.dumps({
    "package": sourcegate.__file__,
    "old": [n for n in OLD_TOP_LEVEL if importlib.util.find_spec(n) is not None],
    "report_template": str(report.TEMPLATES / "report.html.j2"),
    "runs_template": reports._TEMPLATES.get_template("runs.html.j2").filename,
}))
""".replace("OLD_TOP_LEVEL", repr(OLD_TOP_LEVEL))


def run(args: list, cwd: Path, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def build_wheel(tmp: Path) -> Path:
    """The wheel from a copy of what it is built from, so no build/ or egg-info lands in the checkout."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "sourcegate", src / "sourcegate", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", src],
        tmp,
        os.environ.copy(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("sourcegate-*.whl")
    return wheel


def fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A venv holding only the wheel; the dependencies seen through a .pth line naming this venv's site-packages."""
    venv = tmp / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", venv], tmp, os.environ.copy()).returncode == 0
    python = venv / "bin" / "python"
    out = run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel], tmp, clean_env())
    assert out.returncode == 0, out.stderr[-3000:]
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, clean_env())
    (Path(site.stdout.strip()) / "sourcegate-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def clean_env(**extra: str) -> dict:
    """The environment without the checkout on the path and without Airflow or sourcegate settings of the session."""
    keep = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("AIRFLOW", "SOURCEGATE_"))}
    return keep | extra


def last_json(out: subprocess.CompletedProcess, returncode: int = 0):
    """The command's JSON answer: its last stdout line (Airflow logs warnings to stdout before it)."""
    assert out.returncode == returncode, (out.stdout[-2000:], out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.airflow
def test_the_wheel_installs_and_its_dag_parses_outside_the_checkout(tmp_path):
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"sourcegate"}, top
    for template in ("sourcegate/evals/templates/report.html.j2", "sourcegate/plugins/templates/runs.html.j2"):
        assert template in names

    venv = fresh_venv(tmp_path, wheel)
    python = venv / "bin" / "python"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    # A user's Airflow: its own home, DAG folder and project folder (the config the DAGs read), nothing of the checkout.
    airflow_home, project = tmp_path / "airflow", tmp_path / "project"
    (airflow_home / "dags").mkdir(parents=True)
    (airflow_home / "dags" / "team_sourcegate.py").write_text(USER_DAG)
    (project / "config").mkdir(parents=True)
    shutil.copy(ROOT / "config" / "pipeline.yaml", project / "config" / "pipeline.yaml")
    airflow_env = {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(airflow_home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }

    probe = last_json(run([python, "-c", PROBE], outside, clean_env(**airflow_env)))
    inside = [probe[k] for k in ("package", "report_template", "runs_template")]
    assert all(Path(p).is_relative_to(venv) and Path(p).is_file() for p in inside), probe
    assert probe["old"] == [], f"old top-level packages still importable: {probe['old']}"

    cli = run([venv / "bin" / "sourcegate", "--help"], outside, clean_env())
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert "usage: sourcegate" in cli.stdout

    airflow = [python, "-m", "airflow"]
    migrated = run([*airflow, "db", "migrate"], outside, clean_env(**airflow_env))  # the CLI refuses an unmigrated DB
    assert migrated.returncode == 0, migrated.stderr[-3000:]

    # Without a project folder the DAG file fails to import, naming the variable to set: the check can fail
    # (the command then exits 1).
    list_errors = [*airflow, "dags", "list-import-errors", "--local", "-o", "json"]
    errors = last_json(run(list_errors, outside, clean_env(**airflow_env)), returncode=1)
    assert len(errors) == 1 and "SOURCEGATE_HOME" in errors[0]["error"], errors

    user = clean_env(**airflow_env, SOURCEGATE_HOME=str(project))
    errors = last_json(run(list_errors, outside, user))
    assert errors == []
    dags = last_json(run([*airflow, "dags", "list", "--local", "-o", "json"], outside, user))
    assert {d["dag_id"] for d in dags} == {"team_sourcegate_nightly", "sourcegate_recalibrate"}
