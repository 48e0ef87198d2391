"""`sonde`, the command-line client, from an installed wheel (also
`python -m sonde.cli`): runs the CLI binary shipped in the package."""

from sonde.collector import run


def main(argv=None):
    run("sonde", argv)


if __name__ == "__main__":
    main()
