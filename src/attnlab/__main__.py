"""``python -m attnlab`` — the same as the ``attnlab`` command.

Ctrl-C while the command line is still being imported prints ``attnlab: interrupted`` and exits
with 130, as it does once :func:`attnlab.cli.main` runs: ``import attnlab`` imports no torch (its
public names load on first use), so the handlers below are in place before anything heavy loads.
"""

import sys


def _run() -> int:
    try:
        from attnlab.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("attnlab: interrupted\n")
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(_run())
