"""Build of the optional native accelerators (everything else is in pyproject.toml).

``esper.telemetry._columns`` speeds up the telemetry writer's Struct -> Arrow
conversion, ``esper.telemetry._emit`` the hub's ``emit``, ``esper_analysis._grouped``
the reward breakdown's passes over its columns, ``esper_analysis._rle`` the event
counts' histograms. All are optional: without a C compiler the build skips them and
pure-Python code does the same work (pyarrow's converter; the hub's locked Python path;
numpy and polars), with the same output.
"""

from setuptools import Extension, setup


def optional(name: str, *sources: str, depends: tuple[str, ...] = ()) -> Extension:
    """A C module the install builds where it can, and skips otherwise."""
    return Extension(name, sources=list(sources), depends=list(depends), optional=True)


setup(
    ext_modules=[
        optional(
            "esper.telemetry._columns",
            "src/esper/telemetry/_columns.c",
            "src/esper/telemetry/_columns_values.c",
            depends=("src/esper/telemetry/_columns_values.h",),
        ),
        optional("esper.telemetry._emit", "src/esper/telemetry/_emit.c"),
        optional("esper_analysis._grouped", "analysis/esper_analysis/_grouped.c"),
        optional("esper_analysis._rle", "analysis/esper_analysis/_rle.c"),
    ]
)
