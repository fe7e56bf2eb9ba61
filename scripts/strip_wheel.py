"""Writes a copy of a rustccl wheel whose shared libraries have no debug
information (``strip --strip-debug``), with its RECORD rewritten: the
release build keeps line tables (``debug = 1``), which make the wheel ~8 MB
and its libraries ~27 MB. For carrying builds to a device machine, whose
working tree travels under a size limit:

    python scripts/strip_wheel.py wheelhouse/rustccl-*.whl .carry/st1/
"""

import base64
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile


def strip_wheel(src: str, out_dir: str) -> str:
    out = os.path.join(out_dir, os.path.basename(src))
    with tempfile.TemporaryDirectory() as root:
        with zipfile.ZipFile(src) as z:
            z.extractall(root)
        files = []
        for dp, _, fs in os.walk(root):
            for f in fs:
                files.append(os.path.relpath(os.path.join(dp, f), root))
        for p in files:
            if p.endswith(".so"):
                subprocess.run(["strip", "--strip-debug", os.path.join(root, p)], check=True)
        record = next(p for p in files if p.endswith(".dist-info/RECORD"))
        lines = []
        for p in sorted(f for f in files if f != record):
            data = open(os.path.join(root, p), "rb").read()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{p},sha256={digest},{len(data)}")
        lines.append(f"{record},,")
        with open(os.path.join(root, record), "w") as f:
            f.write("\n".join(lines) + "\n")
        os.makedirs(out_dir, exist_ok=True)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for p in sorted(files):
                z.write(os.path.join(root, p), p)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: strip_wheel.py WHEEL OUT_DIR")
    print(strip_wheel(sys.argv[1], sys.argv[2]))
