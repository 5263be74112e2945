"""Build of the optional native accelerators (everything else is in pyproject.toml).

``esper.telemetry._columns`` speeds up the telemetry writer's Struct -> Arrow
conversion, ``esper.telemetry._emit`` the hub's ``emit``, ``esper_analysis._grouped``
the reward breakdown's passes over its columns, ``esper_analysis._rle`` the event
counts' histograms. All are optional: without a C compiler the build skips them and
pure-Python code does the same work (pyarrow's converter; the hub's locked Python path;
numpy and polars), with the same output.
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
        Extension(
            "esper_analysis._grouped",
            sources=["analysis/esper_analysis/_grouped.c"],
            optional=True,
        ),
        Extension(
            "esper_analysis._rle",
            sources=["analysis/esper_analysis/_rle.c"],
            optional=True,
        ),
    ]
)
