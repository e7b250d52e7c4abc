"""Build hook: generate the gRPC code from protos/ before the packages are collected.

All metadata lives in pyproject.toml; this file only makes code generation part of every install
(regular and editable), so a fresh clone never runs with missing or stale generated modules.
"""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithProtos(build_py):
    def run(self):
        sys.path.insert(0, str(HERE))
        from services.codegen import generate

        generate(HERE, HERE / "protos")
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos})
