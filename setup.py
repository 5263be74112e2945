"""Build of the optional native column converter (everything else is in pyproject.toml).

``esper.telemetry._columns`` speeds up the telemetry writer's Struct -> Arrow
conversion, ``esper.telemetry._emit`` the hub's ``emit``. Both are optional: without a C
compiler the build skips them and pure-Python code does the same work (pyarrow's
converter; the hub's locked Python path), with the same output.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "esper.telemetry._columns",
            sources=["src/esper/telemetry/_columns.c", "src/esper/telemetry/_columns_values.c"],
            depends=["src/esper/telemetry/_columns_values.h"],
            optional=True,
        ),
        Extension(
            "esper.telemetry._emit",
            sources=["src/esper/telemetry/_emit.c"],
            optional=True,
        ),
    ]
)
