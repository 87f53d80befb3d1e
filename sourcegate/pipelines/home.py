"""The project folder: where the config file, the corpus, the eval sets and the demo's trained models are found.

In a checkout it is the repository root. An installed wheel carries code and templates only, so a deployment
names its project folder with SOURCEGATE_HOME (docs/deploying.md): the folder holding config/pipeline.yaml and
whatever that config names by a relative path (corpus, config/evals, models/).
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "SOURCEGATE_HOME"
# sourcegate/pipelines/home.py -> the folder holding the sourcegate package: the repository root in a checkout,
# site-packages in an installed wheel (which holds no project files).
CHECKOUT = Path(__file__).resolve().parents[2]


def home() -> Path:
    """$SOURCEGATE_HOME when set, else the folder the package sits in (a checkout's root)."""
    configured = os.environ.get(HOME_ENV)
    return Path(configured).expanduser().resolve() if configured else CHECKOUT
