#!/usr/bin/env python3
"""Checks deploy/kubernetes/*.yaml and deploy/systemd/*.service against the
binary they run: every document parses, every StatefulSet's serviceName
names a headless Service, and every --flag given to sonde-cluster is one
`sonde-cluster --helpfull` knows (so a renamed flag cannot leave the
manifests behind). Prints "check-manifests: N passed, N failed".

Usage: check-manifests.py SONDE_CLUSTER_BINARY [DEPLOY_DIR]
"""
import glob
import os
import re
import subprocess
import sys

import yaml

binary = sys.argv[1]
deploy = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.abspath(__file__))
helpfull = subprocess.run([binary, "--helpfull"], capture_output=True, text=True)
known = set(re.findall(r"--([a-z_]+)", helpfull.stdout + helpfull.stderr))
passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("check-manifests: FAIL", what)


check("role" in known and "nats" in known, "sonde-cluster --helpfull lists its flags")
manifests = sorted(glob.glob(os.path.join(deploy, "kubernetes", "*.yaml")))
check(len(manifests) >= 3, "deploy/kubernetes has the etcd, nats and sonde manifests")
headless = set()
statefulsets = []
for path in manifests:
    name = os.path.basename(path)
    try:
        docs = [d for d in yaml.safe_load_all(open(path)) if d]
    except yaml.YAMLError as e:
        check(False, "%s parses: %s" % (name, e))
        continue
    check(True, "%s parses" % name)
    for d in docs:
        kind = d.get("kind")
        check(kind in ("Service", "StatefulSet", "Deployment", "ConfigMap"),
              "%s: known kind %s" % (name, kind))
        if kind == "Service" and d["spec"].get("clusterIP") == "None":
            headless.add(d["metadata"]["name"])
        if kind == "StatefulSet":
            statefulsets.append((name, d))
        if kind in ("StatefulSet", "Deployment"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                if c.get("command") != ["/usr/bin/sonde-cluster"]:
                    continue
                for arg in c.get("args", []):
                    flag = re.match(r"--([a-z_]+)", arg)
                    check(flag is not None and flag.group(1) in known,
                          "%s: sonde-cluster knows %s" % (name, arg))
for name, s in statefulsets:
    check(s["spec"]["serviceName"] in headless,
          "%s: StatefulSet %s has its headless Service" % (name, s["metadata"]["name"]))
for path in sorted(glob.glob(os.path.join(deploy, "systemd", "*.service"))):
    name = os.path.basename(path)
    text = open(path).read()
    check("[Service]" in text and "ExecStart=" in text, "%s is a service unit" % name)
    for line in text.splitlines():
        if "sonde-cluster" in line and (line.startswith("ExecStart=") or line.startswith("#   SONDE_")):
            for flag in re.findall(r"--([a-z_]+)", line):
                check(flag in known, "%s: sonde-cluster knows --%s" % (name, flag))
        if line.startswith("#     --"):
            for flag in re.findall(r"--([a-z_]+)", line):
                check(flag in known, "%s: sonde-cluster knows --%s" % (name, flag))
print("check-manifests: %d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
