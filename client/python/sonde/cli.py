"""`sonde`, the command-line client, from an installed wheel (also
`python -m sonde.cli`): runs the CLI binary shipped in the package."""

import os
import sys

from sonde.collector import binary


def main(argv=None):
    path = binary("sonde")
    args = sys.argv[1:] if argv is None else list(argv)
    os.execv(path, [path] + args)


if __name__ == "__main__":
    main()
