"""The `edge-sdk` command (and `python -m edge_sdk`): the CLI imported inside the interrupt handling, so that Ctrl-C
while Python imports it (click, numpy and the command modules: a few tenths of a second) ends as it does during a
command, with one line and exit status 130 (cli.INTERRUPTED, which cannot be imported yet) instead of a traceback."""

import sys


def run() -> None:
    try:
        from edge_sdk.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("edge-sdk: interrupted; nothing was written\n")
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
