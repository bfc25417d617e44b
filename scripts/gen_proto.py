"""Regenerate otel_plumb/proto_gen/ from proto/otel_plumb/v1/*.proto with grpcio-tools.

    python scripts/gen_proto.py            # rewrite otel_plumb/proto_gen/
    python scripts/gen_proto.py --out DIR  # write elsewhere (the tests compare the two)

protoc writes modules that import each other by their proto package path
(``from otel_plumb.v1 import trajectory_pb2``); they are flattened into one Python package
and those imports made package-relative, so the generated code lives inside otel_plumb.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_PACKAGE = Path("otel_plumb/v1")
DEFAULT_OUT = ROOT / "otel_plumb" / "proto_gen"
_ABSOLUTE_IMPORT = re.compile(r"^from otel_plumb\.v1 import (\w+)", re.MULTILINE)
_INIT = '"""Generated from proto/otel_plumb/v1 by scripts/gen_proto.py; do not edit."""\n'
# Generated code is not ours to type-check; the .pyi stubs give callers their types.
_MYPY_HEADER = "# mypy: ignore-errors\n"


def generate(out: Path) -> list[Path]:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PROTO_PACKAGE).glob("*.proto"))
    well_known = str(resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for generated in sorted((Path(tmp) / PROTO_PACKAGE).iterdir()):
            text = _MYPY_HEADER + _ABSOLUTE_IMPORT.sub(r"from . import \1", generated.read_text())
            target = out / generated.name
            target.write_text(text)
            written.append(target)
    init = out / "__init__.py"
    init.write_text(_INIT)
    return [init, *written]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
