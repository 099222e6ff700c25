"""Generate protobuf/gRPC stubs from protos/llmfleet/v1 into libs/llmfleet/api/v1.

protoc emits ``from llmfleet.v1 import x_pb2``; the stubs live in the ``llmfleet.api.v1`` package, so
imports are rewritten. Files are only written when their content changes, which keeps the step
idempotent; ``--check`` exits non-zero when the committed stubs are stale (used by CI).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"
PROTO_DIR = PROTO_ROOT / "llmfleet" / "v1"
OUT_DIR = ROOT / "libs" / "llmfleet" / "api" / "v1"
IMPORT_RE = re.compile(r"^from llmfleet\.v1 import", re.MULTILINE)


def generate() -> dict[str, str]:
    import grpc_tools
    from grpc_tools import protoc  # dev dependency; imported lazily

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_DIR.glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out: dict[str, str] = {}
        for f in sorted((Path(tmp) / "llmfleet" / "v1").iterdir()):
            if f.suffix in (".py", ".pyi"):
                out[f.name] = IMPORT_RE.sub("from llmfleet.api.v1 import", f.read_text())
        out["__init__.py"] = '"""Generated gRPC stubs for llmfleet.v1 (do not edit; run `make protos`)."""\n'
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="fail if committed stubs are stale")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    files = generate()
    stale = [
        n for n, text in files.items() if not (OUT_DIR / n).exists() or (OUT_DIR / n).read_text() != text
    ]
    extra = [p.name for p in OUT_DIR.glob("*.py*") if p.name not in files] if OUT_DIR.exists() else []
    if args.check:
        if stale or extra:
            print(f"stale stubs in {OUT_DIR.relative_to(ROOT)}: {sorted(stale + extra)}; run `make protos`")
            return 1
        print("stubs up to date")
        return 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for n in stale:
        (OUT_DIR / n).write_text(files[n])
    for n in extra:
        (OUT_DIR / n).unlink()
    if stale or extra or not args.quiet:
        print(f"stubs: {len(stale)} written, {len(extra)} removed, {len(files)} total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
