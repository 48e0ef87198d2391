#!/bin/sh
# deploy/kubernetes and deploy/systemd against the sonde-cluster they run
# (deploy/check-manifests.py).
exec /usr/bin/python3 deploy/check-manifests.py server/cluster/sonde-cluster deploy
