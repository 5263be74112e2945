"""Build of the optional native column converter (everything else is in pyproject.toml).

``esper.telemetry._columns`` speeds up the telemetry writer's Struct -> Arrow
conversion. It is optional: without a C compiler the build skips it and the writer uses
pyarrow's converter, with the same output.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "esper.telemetry._columns",
            sources=["src/esper/telemetry/_columns.c"],
            optional=True,
        )
    ]
)
