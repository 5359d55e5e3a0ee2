"""The ``kcoord`` console script: ``chaos`` goes to the chaos suite, ``pipeline`` to the Spark
pipeline, everything else to the node's command line (``kcoord.node.cli``), which may not
import the layers above it.

  kcoord chaos run|clean ...    the chaos suite (kcoord.chaos.runner)
  kcoord pipeline ...           the Spark pipeline (kcoord.pipeline.cli)
  kcoord <anything else>        node, cluster, quorum, dump-log, groups, topics (kcoord.node.cli)
"""

from __future__ import annotations

import os
import select
import sys


def main(argv: list[str] | None = None) -> int:
    """Run the command; one whose output is piped into a reader that stops reading (``kcoord
    topics describe | head``) stops quietly with status 1, as Python's documentation on
    SIGPIPE advises (Kafka's tools write to a PrintStream, which ignores the error); it
    ended in a traceback."""
    try:
        status = _dispatch(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # what is still buffered fails here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # a socket's, not stdout's
        # stdout goes to /dev/null so the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end is closed (poll reports an error on it)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def _dispatch(args: list[str]) -> int:
    if args and args[0] == "chaos":
        from kcoord.chaos.runner import main as chaos_main

        return chaos_main(args[1:])
    if args and args[0] == "pipeline":
        from kcoord.pipeline.cli import main as pipeline_main

        return pipeline_main(args[1:])
    from kcoord.node.cli import main as node_main

    return node_main(args)


if __name__ == "__main__":
    sys.exit(main())
