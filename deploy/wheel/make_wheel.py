"""Writes a wheel (PEP 427) of a staged `sonde` package: the folder --stage
holds sonde/ as it will be installed (Python sources, the v1 stubs, the
extension for one CPython, bin/ with the collector and the CLI). The wheel
is not pure: it is tagged for that CPython (cp3XX-cp3XX) and linux_x86_64;
`auditwheel repair` then bundles the shared libraries and sets the
manylinux tag that tells the truth about the glibc it needs.

Writing the archive here, rather than with setuptools, needs nothing from
the target Python: one tool venv builds the wheels of every CPython.
"""

import argparse
import base64
import hashlib
import os
import stat
import sys
import zipfile

SUMMARY = "Real-time debugger for machine-learning training: hook, collector, rules, trials"
REQUIRES = [
    "grpcio>=1.51",
    "protobuf>=4.21",
    "numpy>=1.21",
]
SCRIPTS = {
    "sonde-collector": "sonde.collector:main",
    "sonde": "sonde.cli:main",
}


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--python_tag", required=True, help="e.g. cp312")
    p.add_argument("--requires_python", default=">=3.10")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    tag = "%s-%s-linux_x86_64" % (args.python_tag, args.python_tag)
    name = "sonde-%s-%s.whl" % (args.version, tag)
    dist_info = "sonde-%s.dist-info" % args.version
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, name)
    records = []
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as whl:
        for root, dirs, files in os.walk(args.stage):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(".pyc"):
                    continue
                full = os.path.join(root, f)
                arc = os.path.relpath(full, args.stage).replace(os.sep, "/")
                with open(full, "rb") as fh:
                    data = fh.read()
                info = zipfile.ZipInfo(arc, date_time=(2026, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                mode = os.stat(full).st_mode
                info.external_attr = ((stat.S_IFREG | (0o755 if mode & 0o111 else 0o644)) << 16)
                whl.writestr(info, data)
                records.append(record_line(arc, data))
        metadata = "\n".join(
            ["Metadata-Version: 2.1", "Name: sonde", "Version: %s" % args.version,
             "Summary: %s" % SUMMARY, "License: Apache-2.0",
             "Requires-Python: %s" % args.requires_python]
            + ["Requires-Dist: %s" % r for r in REQUIRES]
            + ["Provides-Extra: torch", 'Requires-Dist: torch>=1.13; extra == "torch"', ""])
        wheel = "\n".join(["Wheel-Version: 1.0", "Generator: sonde make_wheel.py",
                           "Root-Is-Purelib: false", "Tag: %s" % tag, ""])
        entry = "[console_scripts]\n" + "".join(
            "%s = %s\n" % (k, v) for k, v in sorted(SCRIPTS.items()))
        for fname, text in (("METADATA", metadata), ("WHEEL", wheel),
                            ("entry_points.txt", entry), ("top_level.txt", "sonde\n")):
            arc = "%s/%s" % (dist_info, fname)
            whl.writestr(arc, text)
            records.append(record_line(arc, text.encode()))
        records.append("%s/RECORD,," % dist_info)
        whl.writestr("%s/RECORD" % dist_info, "\n".join(records) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
