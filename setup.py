"""The compiled OTLP decoder (everything else is in pyproject.toml).

Optional: without a C compiler the install still succeeds and the pure-Python decoder is used.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "otel_plumb.receive._otlp_native",
            ["otel_plumb/receive/_otlp_native.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wno-missing-field-initializers"],
        )
    ]
)
