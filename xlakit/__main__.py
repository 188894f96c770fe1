"""`python -m xlakit info`: what a bug report needs, as plain text (environment.py)."""
import argparse

from .environment import info


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m xlakit")
    parser.add_argument("command", choices=["info"],
                        help="info: versions and the tested ranges, devices, cache, Graphviz and the widget's JavaScript")
    parser.parse_args()
    info()


if __name__ == "__main__":
    main()
