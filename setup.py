"""Build hook: generate the gRPC code from protos/ before setuptools looks for packages, and build
the optional C accelerator for the record codec.

All metadata lives in pyproject.toml; this file only makes code generation part of every install
(regular and editable). It runs at import time, not in a build_py step, because package discovery
happens first: an editable install maps only the packages that exist when it starts, and the
generated ``tributary``/``etcdrpc`` packages must be among them.

``services.records._speedups`` is optional, as aiokafka's Cython modules are: when it cannot be
compiled (no compiler, no Python headers) the install still succeeds with a warning, and
``services.records`` uses its pure-Python code (``services.records.speedups_enabled()`` says which).
"""

import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from services.codegen import generate  # noqa: E402

# What a missing or broken toolchain raises; anything else is a bug worth failing on.
_BUILD_ERRORS = (CCompilerError, ExecError, PlatformError, OSError, ValueError)


class OptionalBuildExt(build_ext):
    """``build_ext`` that warns instead of failing: every extension here has a Python fallback.

    An extension that fails to build is dropped from ``self.extensions``, because setuptools
    later copies each listed extension into the source tree (editable installs) or the wheel,
    and a missing one would fail the install after all.
    """

    def run(self) -> None:
        try:
            super().run()
        except _BUILD_ERRORS as exc:
            self._warn("the C extensions", exc)
            self.extensions: list[Extension] = []

    def build_extensions(self) -> None:
        self.check_extensions_list(self.extensions)
        built = []
        for ext in self.extensions:
            try:
                self.build_extension(ext)
            except _BUILD_ERRORS as exc:
                self._warn(ext.name, exc)
            else:
                built.append(ext)
        self.extensions = built

    @staticmethod
    def _warn(what: str, exc: Exception) -> None:
        bar = "*" * 78
        print(
            f"\n{bar}\nWARNING: could not compile {what} ({type(exc).__name__}: {exc}).\n"
            "Tributary is installed without them and uses the slower pure-Python record codec.\n"
            f"{bar}\n",
            file=sys.stderr,
        )


generate(HERE, HERE / "protos")
setup(
    ext_modules=[Extension("services.records._speedups", ["services/records/_speedups.c"])],
    cmdclass={"build_ext": OptionalBuildExt},
)
