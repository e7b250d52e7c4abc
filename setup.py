"""Build hook: generate the gRPC code from protos/ before setuptools looks for packages.

All metadata lives in pyproject.toml; this file only makes code generation part of every install
(regular and editable). It runs at import time, not in a build_py step, because package discovery
happens first: an editable install maps only the packages that exist when it starts, and the
generated ``tributary``/``etcdrpc`` packages must be among them.
"""

import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from services.codegen import generate  # noqa: E402

generate(HERE, HERE / "protos")
setup()
