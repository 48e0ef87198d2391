"""`sonde-collector` from an installed wheel (also `python -m sonde.collector`):
runs the collector binary shipped in the package, with the same flags
(`sonde-collector --help` lists them)."""

import os
import sys


def shipped_path(name):
    """Where a wheel puts the binary `name` (bin/<name> in the package)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", name)


def binary(name="sonde-collector"):
    """The path of a binary shipped in the package (bin/<name>; by default
    the collector's)."""
    path = shipped_path(name)
    if not os.access(path, os.X_OK):
        raise SystemExit(
            "sonde: %s is not part of this installation (looked for %s). Install a wheel "
            "made by deploy/build-wheels.sh, or in a source tree run "
            "`bazel run //server:sonde-collector`." % (name, path))
    return path


def run(name, argv=None):
    """Replaces this process with the shipped binary `name`, given `argv`
    (default: this process's arguments)."""
    path = binary(name)
    args = sys.argv[1:] if argv is None else list(argv)
    os.execv(path, [path] + args)


def main(argv=None):
    run("sonde-collector", argv)


if __name__ == "__main__":
    main()
