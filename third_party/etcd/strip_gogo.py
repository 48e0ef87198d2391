#!/usr/bin/env python3
"""Copies etcd's v3 API protos (Debian's golang-etcd-server-dev) without
their Go-only parts, so Debian's protoc can generate C++ from them.

Removed: the gogoproto and google.api imports, `option (gogoproto.*)`
lines, `[(gogoproto.*) = ...]` field options and `option (google.api.http)`
blocks (the JSON gateway's routes). Kept: every message, field number and
service method, so the wire format is etcd's own. Imports are rewritten to
third_party/etcd/<pkg>/<file>.proto.

Usage: strip_gogo.py ETCD_SOURCE_ROOT OUT_ROOT
"""
import os
import re
import sys

FILES = {
    "etcdserver/etcdserverpb/rpc.proto": "etcdserverpb/rpc.proto",
    "mvcc/mvccpb/kv.proto": "mvccpb/kv.proto",
    "auth/authpb/auth.proto": "authpb/auth.proto",
}
IMPORTS = {
    "etcd/mvcc/mvccpb/kv.proto": "third_party/etcd/mvccpb/kv.proto",
    "etcd/auth/authpb/auth.proto": "third_party/etcd/authpb/auth.proto",
}


def strip(text):
    out = []
    depth = 0  # inside an `option (google.api.http) = {...};` block
    for line in text.splitlines():
        if depth:
            depth += line.count("{") - line.count("}")
            continue
        if re.match(r'\s*option \(google\.api\.http\)', line):
            depth = line.count("{") - line.count("}")
            continue
        if re.match(r'\s*import "(gogoproto/gogo|google/api/annotations)\.proto";', line):
            continue
        if re.match(r'\s*option \(gogoproto\.[a-z_]+\) = [^;]*;', line):
            continue
        m = re.match(r'(\s*import ")([^"]+)(";.*)', line)
        if m and m.group(2) in IMPORTS:
            line = m.group(1) + IMPORTS[m.group(2)] + m.group(3)
        line = re.sub(r'\s*\[\s*\(gogoproto\.[^\]]*\]', "", line)
        out.append(line)
    if depth:
        raise SystemExit("unbalanced option block")
    return "\n".join(out) + "\n"


def main():
    src, dst = sys.argv[1], sys.argv[2]
    for rel, target in FILES.items():
        with open(os.path.join(src, rel)) as f:
            text = strip(f.read())
        path = os.path.join(dst, "third_party/etcd", target)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
